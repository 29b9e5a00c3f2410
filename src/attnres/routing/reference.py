"""The reference router: method §2 written out plainly. Every faster path is tested against it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres.norm import rms_norm
from attnres.routing.lean import compute_dtype


def route_reference(query: torch.Tensor, key_gain: torch.Tensor, sources: Sequence[torch.Tensor],
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over depth with a static pseudo-query.

    query, key_gain: (D,); sources: n tensors of shape (B, T, D), possibly of mixed dtypes.
    Returns (mixed, weights): mixed (B, T, D) = sum_i alpha_i * V_i in the sources' promoted dtype;
    weights (B, T, n) = alpha, the softmax over i of query . RMSNorm_gain(V_i), computed in fp32
    (float64 when the inputs are float64). No 1/sqrt(D) scale, no temperature.
    """
    if len(sources) == 0:
        raise ValueError("route_reference needs at least one source, got none")
    out_dtype, compute = compute_dtype(list(sources))
    w = query.to(compute)
    # Elementwise product and sum rather than a matmul, so bf16 autocast cannot lower the logits.
    logits = torch.stack([(rms_norm(v.to(compute), key_gain.to(compute), eps) * w).sum(-1) for v in sources],
                         dim=-1)
    weights = torch.softmax(logits, dim=-1)
    mixed = sum(weights[..., i, None] * v.to(compute) for i, v in enumerate(sources))
    return mixed.to(out_dtype), weights
