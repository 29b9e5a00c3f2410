"""Stream mixers (method §7.3): the base of hyper-connections (`hyper_connections.py`) and mHC
(`mhc.py`), and the stream arithmetic they share.

Both widen the residual stream into n streams X (B, T, n, D). Every sub-layer s has one mixer that
reads the streams into the sub-layer's input and, after the sub-layer, writes its output back:

    h_s  = sum_j a_pre[j] X_j                                   (read: `forward`)
    X'_k = sum_j A_res[j, k] X_j + a_post[k] delta_s            (write: `write`)

and a final collapse turns the streams into the hidden state the head reads. The coefficients come
from the streams themselves (dynamic) or are plain parameters (static hyper-connections); they are
computed once per sub-layer, in `forward`, which returns (h, weights) like every depth mixer and
appends the coefficients to the list it is given as `written`, for `write`.

All stream arithmetic runs in the streams' dtype promoted with fp32, autocast off: the streams
are the residual stream, which attnres keeps in fp32 under autocast like the standard residual.

Two ways to compute the same thing (`lean`): the reference normalises the streams, projects the
normalised copy and collapses by a broadcast product and sum, as the papers write it; the lean
path (the default) projects the raw streams and scales by the inverse RMS afterwards,
RMSNorm_g(x) . w = inv_rms(x) (x . (g * w)), and collapses by a batched matrix product, so no
normalised copy of the streams and no (B, T, n, D) product is made or kept for backward: autograd
keeps the streams themselves and per-token scalars (and, for mHC, the Sinkhorn-Knopp iterations'
n x n matrices).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from attnres.common.precision import autocast_off
from attnres.methods.depth_mixer import DepthMixer, MixerFlops

# The routing implementations of the stream methods: their fast path ("lean") recomputes in backward;
# the routing kernels do not apply.
STREAM_IMPLS = ("auto", "reference", "lean")


def stream_dtype(streams: Tensor) -> torch.dtype:
    """The dtype stream arithmetic runs in: the streams' promoted with fp32."""
    return torch.promote_types(streams.dtype, torch.float32)


def unit_rms(x: Tensor, eps: float) -> Tensor:
    """x / rms(x) over the last axis, no gain (transformers' unweighted RMSNorm)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def collapse(weights: Tensor, streams: Tensor, lean: bool = True) -> Tensor:
    """sum_j weights[..., j] X_j: weights (B, T, n) or (n,), streams (B, T, n, D) -> (B, T, D)."""
    if lean:  # (.., 1, n) @ (.., n, D): no (B, T, n, D) product
        return (weights.unsqueeze(-2) @ streams).squeeze(-2)
    return (weights.unsqueeze(-1) * streams).sum(dim=-2)


def normalised_projection(x: Tensor, weight: Tensor, eps: float, gain: Tensor | None = None,
                          lean: bool = True) -> Tensor:
    """(x / rms(x) * gain) @ weight over the last axis: x (..., K), weight (K, M), gain (K,) or None -> (..., M).

    The lean path computes inv_rms(x) * (x @ (gain * weight)) and keeps only x and per-row scalars."""
    if not lean:
        normed = unit_rms(x, eps)
        return (normed if gain is None else normed * gain) @ weight
    scaled = weight if gain is None else gain.unsqueeze(-1) * weight
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return (x @ scaled) * torch.rsqrt(norm * norm / x.shape[-1] + eps)


def expand_and_mix(streams: Tensor, delta: Tensor, post: Tensor, res: Tensor) -> Tensor:
    """X'_k = sum_j res[..., j, k] X_j + post[..., k] delta: streams (B, T, n, D), delta (B, T, D),
    post (B, T, n) or (n,), res (B, T, n, n) or (n, n) -> (B, T, n, D)."""
    mixed = torch.matmul(res.transpose(-1, -2), streams)  # (n, n) broadcasts over (B, T)
    return mixed + post.unsqueeze(-1) * delta.unsqueeze(-2)


class StreamMixer(DepthMixer):
    """Base of the stream mixers: `forward` reads, `write` writes (see the module docstring).

    Built as Mixer(hidden_size, eps, num_streams=n, index=s, **options) for sub-layer s; the final
    collapse is `Mixer.final(hidden_size, eps, num_streams=n, **options)`.
    """

    mixes_streams: ClassVar[bool] = True

    def forward(self, streams: Tensor, need_weights: bool = True, lean: bool = True,
                written: list | None = None) -> tuple[Tensor, Tensor | None]:
        """streams (B, T, n, D) -> (h (B, T, D), a_pre as weights (B, T, n) fp32 or None); the write
        coefficients are appended to `written` when given; `lean`: the lean path or the reference
        (the module docstring)."""
        compute = stream_dtype(streams)
        with autocast_off(streams.device):
            x = streams.to(compute)
            pre, post, res = self.coefficients(x, lean)
            h = collapse(pre.expand(*x.shape[:-2], x.shape[-2]), x, lean)
        if written is not None:
            written.append((post, res))
        weights = pre.detach().float().expand(*streams.shape[:-2], streams.shape[-2]) if need_weights else None
        return h, weights

    def write(self, streams: Tensor, delta: Tensor, coefficients: tuple) -> Tensor:
        """streams (B, T, n, D), delta (B, T, D), the coefficients `forward` wrote -> X' (B, T, n, D)."""
        post, res = coefficients
        compute = stream_dtype(streams)
        with autocast_off(streams.device):
            return expand_and_mix(streams.to(compute), delta.to(compute), post, res)

    def coefficients(self, streams: Tensor, lean: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(a_pre (.., n), a_post (.., n), A_res (.., n, n)) from streams (B, T, n, D) in the compute dtype."""
        raise NotImplementedError

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """Read and write over n = num_sources streams, as the lean path computes them: the collapse
        (2 n D) and the stream mix A_res (2 n^2 D) are matrix products, a_post * delta (2 n D) is
        elementwise; plus the coefficients' projection (`projection_flops`, a matrix product)."""
        n, d = num_sources, self.hidden_size
        return MixerFlops(matmul=2 * n * d + 2 * n * n * d + self.projection_flops(n), vector=2 * n * d)

    def projection_flops(self, num_streams: int) -> int:
        """Forward FLOPs per token of the map from the streams to the coefficients (0 when static)."""
        raise NotImplementedError

    @classmethod
    def final(cls, hidden_size: int, eps: float, *, num_streams: int, **options) -> DepthMixer:
        """The final collapse: a DepthMixer whose forward takes the streams (B, T, n, D) and returns
        (hidden (B, T, D), weights (B, T, n) fp32 or None)."""
        raise NotImplementedError


def check_streams(num_streams: int, index: int | None) -> None:
    if not isinstance(num_streams, int) or isinstance(num_streams, bool) or num_streams < 1:
        raise ValueError(f"num_streams must be a positive integer, got {num_streams!r}")
    if index is not None and (not isinstance(index, int) or index < 0):
        raise ValueError(f"index must be a non-negative integer (the sub-layer), got {index!r}")
