"""DenseFormer's depth-weighted average (Pagliardini et al., 2024; method §7) as a depth mixer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnres.common.errors import InputError
from attnres.routing.lean import compute_dtype
from attnres.methods.depth_mixer import DepthMixer, MixerFlops
from attnres.methods.options import VariantOptions, option
from attnres.methods.variant import Variant, register_variant


@dataclass(frozen=True, kw_only=True)
class DenseFormerOptions(VariantOptions):
    """Pagliardini et al.'s k x p DenseFormer: an average after every p-th layer over every k-th state
    (1 x 1: after every layer, over all states)."""

    dilation: int = option(1, "k: the average reads every k-th state (from 1 to num_layers)")
    period: int = option(1, "p: an average after every p-th layer (from 1 to num_layers)")

    def check_model(self, num_layers: int, prefix: str, error: type[Exception] = InputError) -> None:
        for name in ("dilation", "period"):
            value = getattr(self, name)
            if value > num_layers:
                raise error(f"{prefix}{name} must be an integer from 1 to num_layers = {num_layers}, got {value!r}")

    def labels(self) -> list[str]:
        """"(k x p)" when either differs from 1, as the paper names its models."""
        return [] if (self.dilation, self.period) == (1, 1) else [f"({self.dilation}x{self.period})"]


class DepthWeightedAverage(DepthMixer):
    """sum_i alpha_i V_i with plain learned scalars alpha (n,): no softmax, no sign constraint.

    `alpha` starts at (0, ..., 0, 1): the last source (the current layer's output) passes unchanged,
    so a DenseFormer starts as the standard model. Built with the number of sources it averages
    (`takes_num_sources`).
    """

    takes_num_sources = True

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False, *, num_sources: int) -> None:
        super().__init__()
        if gated:
            raise ValueError("the depth-weighted average has no gate (exact_conversion applies to delta_block)")
        if not isinstance(num_sources, int) or num_sources < 1:
            raise ValueError(f"num_sources must be a positive integer, got {num_sources!r}")
        self.hidden_size = hidden_size
        self.alpha = nn.Parameter(torch.zeros(num_sources))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """alpha = (0, ..., 0, 1): the identity on the last source."""
        with torch.no_grad():
            self.alpha.zero_()
            self.alpha[-1] = 1.0

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """The weighted sum: 2 n D per token, elementwise."""
        return MixerFlops(vector=2 * num_sources * self.hidden_size)

    def forward(self, sources: Sequence[torch.Tensor], need_weights: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """n sources (B, T, D) -> (sum_i alpha_i V_i (B, T, D) in the sources' promoted dtype, alpha
        broadcast to (B, T, n) fp32, or None)."""
        if len(sources) != self.alpha.shape[0]:
            raise ValueError(f"this average was built for {self.alpha.shape[0]} sources, got {len(sources)}")
        out_dtype, _ = compute_dtype(list(sources))
        alpha = self.alpha.to(out_dtype)
        mixed = alpha[0] * sources[0]
        for i in range(1, len(sources)):
            mixed = mixed + alpha[i] * sources[i]  # each product saves only a reference to its source
        weights = None
        if need_weights:
            weights = self.alpha.detach().float().expand(*sources[0].shape[:-1], len(sources))
        return mixed, weights


register_variant(Variant("denseformer", "average", "states", "x", mixer=DepthWeightedAverage, options=DenseFormerOptions,
                         method="method §7 (Pagliardini et al., 2024)", color="#9467bd"))
