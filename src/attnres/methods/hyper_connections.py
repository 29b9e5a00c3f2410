"""Hyper-connections (Zhu et al., ICLR 2025, arXiv 2409.19606; method §7.3): n residual streams,
static or dynamic coefficients, and the sum of the streams as the final collapse. The variant
`hyper_connections`: this mixer, its options and one row of the variant table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnres.methods.depth_mixer import DepthMixer, MixerFlops
from attnres.methods.options import VariantOptions, option
from attnres.methods.variant import Variant, register_variant
from attnres.methods.stream_mixer import STREAM_IMPLS, StreamMixer, check_streams, normalised_projection

HC_SCALE_INIT = 0.01  # Zhu et al.: the dynamic corrections' scales s_alpha, s_beta start at 0.01


@dataclass(frozen=True, kw_only=True)
class HyperConnectionOptions(VariantOptions):
    """Hyper-connections' options (Zhu et al., 2025; method §7.3)."""

    streams: int = option(4, "n: the number of residual streams (the papers' default 4)", label="(n={value})")
    dynamic: bool = option(True, "the dynamic form (coefficients from the streams); False: static",
                           label="[static]", mixer="dynamic")


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
        check_streams(num_streams, index)
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
        check_streams(num_streams, None)
        self.num_streams, self.hidden_size = num_streams, hidden_size

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """The sum of n streams: (n - 1) D additions per token, elementwise."""
        return MixerFlops(vector=(num_sources - 1) * self.hidden_size)

    def forward(self, streams: Tensor, need_weights: bool = True, lean: bool = True) -> tuple[Tensor, Tensor | None]:
        """streams (B, T, n, D) -> (sum over n (B, T, D), ones (B, T, n) or None)."""
        weights = torch.ones(streams.shape[:-1], device=streams.device) if need_weights else None
        return streams.sum(dim=-2), weights


register_variant(Variant("hyper_connections", "streams", "streams", "h", mixer=HyperConnection,
                         options=HyperConnectionOptions, impls=STREAM_IMPLS, method="method §7.3 (Zhu et al., 2025)",
                         color="#8c564b"))
