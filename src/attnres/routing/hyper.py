"""Hyper-connections (Zhu et al., 2025) and mHC (DeepSeek, 2025) as stream mixers (method §7.3).

Both widen the residual stream into n streams X (B, T, n, D). Every sub-layer s has one mixer that
reads the streams into the sub-layer's input and, after the sub-layer, writes its output back:

    h_s  = sum_j a_pre[j] X_j                                   (read: `forward`)
    X'_k = sum_j A_res[j, k] X_j + a_post[k] delta_s            (write: `write`)

and a final collapse turns the streams into the hidden state the head reads. The coefficients come
from the streams themselves (dynamic) or are plain parameters (static hyper-connections); they are
computed once per sub-layer, in `forward`, and handed to `write` as `coefficients`.

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

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnres.common.precision import autocast_off
from attnres.routing.mixer import DepthMixer, MixerFlops
from attnres.routing.options import VariantOptions, option

HC_SCALE_INIT = 0.01  # Zhu et al.: the dynamic corrections' scales s_alpha, s_beta start at 0.01


def _compute(streams: Tensor) -> torch.dtype:
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


def sinkhorn(matrix: Tensor, iterations: int, eps: float) -> Tensor:
    """Sinkhorn-Knopp on a positive (..., n, n): columns first, then `iterations` - 1 rounds of rows
    and columns, each divided by its sum + eps (as DeepSeek-V4 in transformers). Columns sum to 1 at
    the end (up to eps), so a mix of equal streams keeps them equal."""
    matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        matrix = matrix / (matrix.sum(dim=-1, keepdim=True) + eps)
        matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    return matrix


def doubly_stochastic(logits: Tensor, iterations: int, eps: float) -> Tensor:
    """mHC's A_res from its logits (..., n, n): Sinkhorn-Knopp of softmax over the last axis + eps."""
    return sinkhorn(torch.softmax(logits, dim=-1) + eps, iterations, eps)


@dataclass(frozen=True, kw_only=True)
class HyperConnectionOptions(VariantOptions):
    """Hyper-connections' options (Zhu et al., 2025; method §7.3)."""

    streams: int = option(4, "n: the number of residual streams (the papers' default 4)", label="(n={value})")
    dynamic: bool = option(True, "the dynamic form (coefficients from the streams); False: static",
                           label="[static]", mixer="dynamic")


@dataclass(frozen=True, kw_only=True)
class ManifoldHyperConnectionOptions(VariantOptions):
    """mHC's options (DeepSeek, 2025; method §7.3)."""

    streams: int = option(4, "n: the number of residual streams (the papers' default 4)", label="(n={value})")
    sinkhorn_iters: int = option(20, "Sinkhorn-Knopp rounds that make A_res doubly stochastic",
                                 label="[{value} sinkhorn]", mixer="sinkhorn_iters")


class StreamMixer(DepthMixer):
    """Base of the stream mixers: `forward` reads, `write` writes (see the module docstring).

    Built as Mixer(hidden_size, eps, num_streams=n, index=s, **options) for sub-layer s; the final
    collapse is `Mixer.final(hidden_size, eps, num_streams=n, **options)`.
    """

    mixes_streams: ClassVar[bool] = True

    def forward(self, streams: Tensor, need_weights: bool = True,
                lean: bool = True) -> tuple[Tensor, Tensor | None, tuple]:
        """streams (B, T, n, D) -> (h (B, T, D), a_pre as weights (B, T, n) fp32 or None, coefficients);
        `lean`: the lean path or the reference (the module docstring)."""
        compute = _compute(streams)
        with autocast_off(streams.device):
            x = streams.to(compute)
            pre, post, res = self.coefficients(x, lean)
            h = collapse(pre.expand(*x.shape[:-2], x.shape[-2]), x, lean)
        weights = pre.detach().float().expand(*streams.shape[:-2], streams.shape[-2]) if need_weights else None
        return h, weights, (post, res)

    def write(self, streams: Tensor, delta: Tensor, coefficients: tuple) -> Tensor:
        """streams (B, T, n, D), delta (B, T, D), coefficients from `forward` -> X' (B, T, n, D)."""
        post, res = coefficients
        compute = _compute(streams)
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
        (hidden (B, T, D), weights (B, T, n) fp32 or None, ())."""
        raise NotImplementedError


def _check_streams(num_streams: int, index: int | None) -> None:
    if not isinstance(num_streams, int) or isinstance(num_streams, bool) or num_streams < 1:
        raise ValueError(f"num_streams must be a positive integer, got {num_streams!r}")
    if index is not None and (not isinstance(index, int) or index < 0):
        raise ValueError(f"index must be a non-negative integer (the sub-layer), got {index!r}")


class HyperConnection(StreamMixer):
    """Hyper-connections (Zhu et al., ICLR 2025, arXiv 2409.19606), static or dynamic.

    Static: a_pre (n), a_post (n), A_res (n, n) are parameters, initialised as the paper's rule for
    sub-layer s: a_pre = e_{s mod n}, a_post = 1, A_res = I. With the streams starting as n copies
    of the embedding, every stream is then the standard residual stream x_s and h_s = x_s.
    Dynamic (the paper's default) adds tanh-gated corrections from the streams, each RMS-normalised
    with a learned gain (X_bar): a_pre + s_a tanh(X_bar w_pre), A_res + s_a tanh(X_bar W_res),
    a_post + s_b tanh(X_bar w_post); the projections start at zero and the scales at 0.01, so the
    start is the static one.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False, *, num_streams: int = 4,
                 index: int = 0, dynamic: bool = True) -> None:
        super().__init__()
        if gated:
            raise ValueError("hyper-connections have no gate (exact_conversion applies to delta_block)")
        _check_streams(num_streams, index)
        n = num_streams
        self.num_streams, self.index, self.eps, self.dynamic, self.hidden_size = n, index, eps, dynamic, hidden_size
        self.pre = nn.Parameter(torch.zeros(n))
        self.post = nn.Parameter(torch.zeros(n))
        self.res = nn.Parameter(torch.zeros(n, n))
        if dynamic:
            self.norm_weight = nn.Parameter(torch.ones(hidden_size))
            self.pre_proj = nn.Parameter(torch.zeros(hidden_size))
            self.post_proj = nn.Parameter(torch.zeros(hidden_size))
            self.res_proj = nn.Parameter(torch.zeros(hidden_size, n))
            self.alpha_scale = nn.Parameter(torch.zeros(()))
            self.beta_scale = nn.Parameter(torch.zeros(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialisation: a_pre = e_{index mod n}, a_post = 1, A_res = I; dynamic
        projections 0, norm gain 1, scales 0.01."""
        with torch.no_grad():
            self.pre.zero_()
            self.pre[self.index % self.num_streams] = 1.0
            self.post.fill_(1.0)
            self.res.copy_(torch.eye(self.num_streams))
            if self.dynamic:
                self.norm_weight.fill_(1.0)
                for p in (self.pre_proj, self.post_proj, self.res_proj):
                    p.zero_()
                self.alpha_scale.fill_(HC_SCALE_INIT)
                self.beta_scale.fill_(HC_SCALE_INIT)

    def coefficients(self, streams: Tensor, lean: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        dtype, n = streams.dtype, self.num_streams
        pre, post, res = self.pre.to(dtype), self.post.to(dtype), self.res.to(dtype)
        if not self.dynamic:
            return pre, post, res
        projections = torch.cat([self.pre_proj.unsqueeze(-1), self.post_proj.unsqueeze(-1), self.res_proj], -1)
        # each stream RMS-normalised with the gain, projected: (B, T, n, 2 + n), row j from X_j
        mixes = torch.tanh(normalised_projection(streams, projections.to(dtype), self.eps, self.norm_weight.to(dtype),
                                                 lean))
        alpha, beta = self.alpha_scale.to(dtype), self.beta_scale.to(dtype)
        return (pre + alpha * mixes[..., 0], post + beta * mixes[..., 1],
                res + alpha * mixes[..., 2:2 + n])

    def projection_flops(self, num_streams: int) -> int:
        """Dynamic: each stream's D values to 2 + n coefficients, 2 n D (2 + n); static: none."""
        return 2 * num_streams * self.hidden_size * (2 + num_streams) if self.dynamic else 0

    @classmethod
    def final(cls, hidden_size: int, eps: float, *, num_streams: int, **options) -> DepthMixer:
        """The paper's output: the sum of the streams."""
        return StreamSum(num_streams, hidden_size)


class StreamSum(DepthMixer):
    """Hyper-connections' final collapse, sum_k X_k; no parameters."""

    mixes_streams: ClassVar[bool] = True

    def __init__(self, num_streams: int, hidden_size: int) -> None:
        super().__init__()
        _check_streams(num_streams, None)
        self.num_streams, self.hidden_size = num_streams, hidden_size

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """The sum of n streams: (n - 1) D additions per token, elementwise."""
        return MixerFlops(vector=(num_sources - 1) * self.hidden_size)

    def forward(self, streams: Tensor, need_weights: bool = True,
                lean: bool = True) -> tuple[Tensor, Tensor | None, tuple]:
        """streams (B, T, n, D) -> (sum over n (B, T, D), ones (B, T, n) or None, ())."""
        weights = torch.ones(streams.shape[:-1], device=streams.device) if need_weights else None
        return streams.sum(dim=-2), weights, ()


def _add_projection(module: nn.Module, rows: int, in_features: int, num_scales: int) -> None:
    """mHC's coefficient map on `module` (named as transformers names it): fn (rows, in_features),
    base (rows,), scale (num_scales,), then initialised by `_reset_projection`."""
    module.fn = nn.Parameter(torch.empty(rows, in_features))
    module.base = nn.Parameter(torch.empty(rows))
    module.scale = nn.Parameter(torch.empty(num_scales))
    _reset_projection(module)


def _reset_projection(module: nn.Module) -> None:
    """fn ~ N(0, module.init_std), base = 0, scale = 1 (DeepSeek-V4's initialisation in transformers)."""
    with torch.no_grad():
        module.fn.normal_(0.0, module.init_std)
        module.base.zero_()
        module.scale.fill_(1.0)


class ManifoldHyperConnection(StreamMixer):
    """mHC (DeepSeek, arXiv 2512.24880), written to compute what transformers' DeepSeek-V4
    `DeepseekV4HyperConnection` computes (tested equal on identical weights).

    From x_bar = unit_rms(flatten(X)) (B, T, nD), one linear map `fn` ((2 + n) n, nD) with a bias
    `base` and three scales `scale` (pre, post, res) gives
        a_pre  = sigmoid(.) + hc_eps,   a_post = 2 sigmoid(.),
        A_res  = Sinkhorn(softmax over k of (.)[j, k] + hc_eps)  (doubly stochastic).
    Initialised as transformers initialises DeepSeek-V4: fn ~ N(0, init_std), base = 0, scale = 1.
    Why not fn = 0 (the hyper-connections' rule for dynamic projections, which would start mHC as the
    standard model up to eps): the n streams start as equal copies, and with fn = 0 every stream's
    coefficients and gradients are equal too, so the streams stay equal forever (seen in a 40-step
    run: equal a_pre on every stream at every mixer). The random projection breaks that symmetry.
    """

    takes_init_std = True

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False, *, num_streams: int = 4,
                 index: int = 0, sinkhorn_iters: int = 20, hc_eps: float = 1e-6, init_std: float = 0.02) -> None:
        super().__init__()
        if gated:
            raise ValueError("mHC has no gate (exact_conversion applies to delta_block)")
        _check_streams(num_streams, index)
        n = num_streams
        self.num_streams, self.index, self.eps, self.hidden_size = n, index, eps, hidden_size
        self.sinkhorn_iters, self.hc_eps, self.init_std = sinkhorn_iters, hc_eps, init_std
        _add_projection(self, (2 + n) * n, n * hidden_size, num_scales=3)  # pre, post, res

    def reset_parameters(self) -> None:
        """fn ~ N(0, init_std), base = 0, scale = 1 (see the class docstring)."""
        _reset_projection(self)

    def coefficients(self, streams: Tensor, lean: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        n, dtype = self.num_streams, streams.dtype
        # unit_rms(flatten(X)) @ fn^T: (B, T, (2 + n) n)
        mixes = normalised_projection(streams.flatten(-2), self.fn.to(dtype).t(), self.eps, lean=lean)
        pre_w, post_w, res_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, res_b = self.base.to(dtype).split([n, n, n * n])
        pre_s, post_s, res_s = self.scale.to(dtype).unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        logits = res_w.unflatten(-1, (n, n)) * res_s + res_b.view(n, n)
        # Autograd keeps the Sinkhorn iterations' n x n values (about 4 iters n^2 per token). Recomputing
        # them in backward (activation checkpointing) saved 15 % of mHC's activations at 24 x 256 but
        # made its CPU training step 1.29x slower (docs/explanation/contenders.md), so they are kept.
        return pre, post, doubly_stochastic(logits, self.sinkhorn_iters, self.hc_eps)

    def projection_flops(self, num_streams: int) -> int:
        """The flattened streams' n D values to (2 + n) n coefficients: 2 n D (2 + n) n. (Sinkhorn's
        iterations, about 4 n^2 divisions and sums each, are not counted, like other elementwise work.)"""
        return 2 * num_streams * self.hidden_size * (2 + num_streams) * num_streams

    @classmethod
    def final(cls, hidden_size: int, eps: float, *, num_streams: int, **options) -> DepthMixer:
        """DeepSeek-V4's head collapse (`DeepseekV4HyperHead`)."""
        return ManifoldHyperHead(hidden_size, eps, num_streams=num_streams, hc_eps=options.get("hc_eps", 1e-6),
                                 init_std=options.get("init_std", 0.02))


class ManifoldHyperHead(DepthMixer):
    """mHC's final collapse: sum_j (sigmoid(x_bar fn_j * scale + base_j) + hc_eps) X_j, with
    x_bar = unit_rms(flatten(X)); fn (n, nD) ~ N(0, init_std), base 0, scale 1 at initialisation."""

    mixes_streams: ClassVar[bool] = True
    takes_init_std = True

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, num_streams: int = 4, hc_eps: float = 1e-6,
                 init_std: float = 0.02) -> None:
        super().__init__()
        _check_streams(num_streams, None)
        self.num_streams, self.eps, self.hc_eps, self.init_std = num_streams, eps, hc_eps, init_std
        self.hidden_size = hidden_size
        _add_projection(self, num_streams, num_streams * hidden_size, num_scales=1)

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """The flattened streams to n weights (2 n D n) and the collapse (2 n D), matrix products."""
        n, d = num_sources, self.hidden_size
        return MixerFlops(matmul=2 * n * d * n + 2 * n * d)

    def reset_parameters(self) -> None:
        """fn ~ N(0, init_std), base = 0, scale = 1."""
        _reset_projection(self)

    def forward(self, streams: Tensor, need_weights: bool = True,
                lean: bool = True) -> tuple[Tensor, Tensor | None, tuple]:
        """streams (B, T, n, D) -> (hidden (B, T, D), its weights (B, T, n) fp32 or None, ())."""
        compute = _compute(streams)
        with autocast_off(streams.device):
            x = streams.to(compute)
            mixes = normalised_projection(x.flatten(-2), self.fn.to(compute).t(), self.eps, lean=lean)
            pre = torch.sigmoid(mixes * self.scale.to(compute) + self.base.to(compute)) + self.hc_eps
            hidden = collapse(pre, x, lean)
        return hidden, (pre.detach().float() if need_weights else None), ()
