"""The reference router: method §2 written out plainly. Every faster path is tested against it.

It also computes the Kimi router ablations (method §7): a per-token query, raw keys (no RMSNorm),
sigmoid weights instead of the softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres.norm import rms_norm
from attnres.routing.lean import compute_dtype


def route_reference(query: torch.Tensor, key_gain: torch.Tensor | None, sources: Sequence[torch.Tensor],
                    eps: float, weights: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over depth: alpha_i = softmax_i(z_i) (or sigmoid(z_i)), z_i = query . RMSNorm_gain(V_i).

    query: (D,) a static pseudo-query, or (B, T, D) one per token (the input-dependent ablation);
    key_gain: (D,), or None for raw keys (z_i = query . V_i, the no-key-norm ablation);
    sources: n tensors of shape (B, T, D), possibly of mixed dtypes; weights: "softmax" (method §2)
    or "sigmoid" (no normalisation over the sources).
    Returns (mixed, alpha): mixed (B, T, D) = sum_i alpha_i * V_i in the sources' promoted dtype;
    alpha (B, T, n), computed in fp32 (float64 when the inputs are float64). No 1/sqrt(D) scale,
    no temperature.
    """
    if len(sources) == 0:
        raise ValueError("route_reference needs at least one source, got none")
    if weights not in ("softmax", "sigmoid"):
        raise ValueError(f"route_reference weights must be 'softmax' or 'sigmoid', got {weights!r}")
    out_dtype, compute = compute_dtype(list(sources))
    w = query.to(compute)

    def key(v: torch.Tensor) -> torch.Tensor:
        return v.to(compute) if key_gain is None else rms_norm(v.to(compute), key_gain.to(compute), eps)

    # Elementwise product and sum rather than a matmul, so bf16 autocast cannot lower the logits.
    logits = torch.stack([(key(v) * w).sum(-1) for v in sources], dim=-1)
    alpha = torch.softmax(logits, dim=-1) if weights == "softmax" else torch.sigmoid(logits)
    mixed = sum(alpha[..., i, None] * v.to(compute) for i, v in enumerate(sources))
    return mixed.to(out_dtype), alpha
