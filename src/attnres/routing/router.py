"""The Router module: one static pseudo-query and one key norm per routed input."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from attnres.norm import RMSNorm
from attnres.routing.reference import route_reference


class Router(nn.Module):
    """R(w, g; V_1 ... V_n) of METHOD §2, optionally scaled by a scalar gate.

    Parameters: `query` (D,) initialised to zero, so the weights start uniform; `key_norm.weight`
    (D,) initialised to one; `gate` () initialised to zero when `gated` (Delta Block's exact
    conversion, METHOD §4), else None.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.key_norm = RMSNorm(hidden_size, eps)
        self.gate = nn.Parameter(torch.zeros(())) if gated else None

    def reset_parameters(self) -> None:
        """Zero query, unit key gain, zero gate: the initialisation both papers prescribe."""
        nn.init.zeros_(self.query)
        self.key_norm.reset_parameters()
        if self.gate is not None:
            nn.init.zeros_(self.gate)

    def forward(self, sources: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """sources: n tensors (B, T, D) -> (gate * sum_i alpha_i V_i (B, T, D), alpha (B, T, n) fp32)."""
        mixed, weights = route_reference(self.query, self.key_norm.weight, sources, self.key_norm.eps)
        if self.gate is not None:
            mixed = self.gate.to(mixed.dtype) * mixed
        return mixed, weights
