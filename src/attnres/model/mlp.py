"""The SwiGLU feed-forward: the dense sub-layer of the decoder, and the shared experts of a mixture of experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres.model.sublayer_protocols import FeedForward


class MLP(FeedForward):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def flops_per_token(self) -> int:
        """2 in x out per token for each of its three projections: 2 x 3 D F."""
        return 2 * 3 * self.gate_proj.in_features * self.gate_proj.out_features
