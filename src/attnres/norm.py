"""RMSNorm, shared by the sub-layers and the routers' keys."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, statistics in at least fp32.

    x: (..., D), weight: (D,) -> (..., D) in x's dtype (as Hugging Face's Qwen3/Llama RMSNorm).
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    x32 = x.to(compute)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learnable gain `weight` (D,), initialised to one."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def reset_parameters(self) -> None:
        """Gain back to one."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
