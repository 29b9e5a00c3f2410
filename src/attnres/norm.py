"""RMSNorm, shared by the sub-layers and the routers' keys."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, statistics in at least fp32.

    x: (..., D), weight: (D,) -> (..., D) in x's dtype (as Hugging Face's Qwen3/Llama RMSNorm).
    """
    return weight * unit_rms(x, eps).to(x.dtype)


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, without a gain: (..., D) -> (..., D) in x's dtype
    promoted with fp32 (float64 stays float64)."""
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


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
