"""mHC (DeepSeek, arXiv 2512.24880; method §7.3): hyper-connections whose stream mixing is doubly
stochastic (Sinkhorn-Knopp), and DeepSeek-V4's head collapse. The variant `mhc`: these mixers,
their options and one row of the variant table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnres.common.precision import autocast_off
from attnres.methods.depth_mixer import DepthMixer, MixerFlops
from attnres.methods.options import VariantOptions, option
from attnres.methods.variant import Variant, register_variant
from attnres.methods.stream_mixer import STREAM_IMPLS, StreamMixer, check_streams, collapse, stream_dtype, normalised_projection


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
class ManifoldHyperConnectionOptions(VariantOptions):
    """mHC's options (DeepSeek, 2025; method §7.3)."""

    streams: int = option(4, "n: the number of residual streams (the papers' default 4)", label="(n={value})")
    sinkhorn_iters: int = option(20, "Sinkhorn-Knopp rounds that make A_res doubly stochastic",
                                 label="[{value} sinkhorn]", mixer="sinkhorn_iters")


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
        check_streams(num_streams, index)
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
        # them in backward saved little memory for much time (docs/explanation/contenders.md), so they are kept.
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
        check_streams(num_streams, None)
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

    def forward(self, streams: Tensor, need_weights: bool = True, lean: bool = True) -> tuple[Tensor, Tensor | None]:
        """streams (B, T, n, D) -> (hidden (B, T, D), its weights (B, T, n) fp32 or None)."""
        compute = stream_dtype(streams)
        with autocast_off(streams.device):
            x = streams.to(compute)
            mixes = normalised_projection(x.flatten(-2), self.fn.to(compute).t(), self.eps, lean=lean)
            pre = torch.sigmoid(mixes * self.scale.to(compute) + self.base.to(compute)) + self.hc_eps
            hidden = collapse(pre, x, lean)
        return hidden, (pre.detach().float() if need_weights else None)


register_variant(Variant("mhc", "streams", "streams", "h", mixer=ManifoldHyperConnection,
                         options=ManifoldHyperConnectionOptions, impls=STREAM_IMPLS,
                         method="method §7.3 (DeepSeek, 2025)", color="#e377c2"))
