"""The Router: one static pseudo-query and one key norm per routed input (method §2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from attnres.norm import RMSNorm
from attnres.routing.mixer import DepthMixer
from attnres.routing.reference import route_reference
from attnres.routing.route import resolve_impl, route_fast
from attnres.routing.two_phase import RoutedPrefix, merge_remaining


class Router(DepthMixer):
    """R(w, g; V_1 ... V_n) of method §2, optionally scaled by a scalar gate.

    Parameters: `query` (D,) initialised to zero, so the weights start uniform; `key_norm.weight`
    (D,) initialised to one; `gate` () initialised to zero when `gated` (Delta Block's exact
    conversion, method §4), else None.
    """

    static_query = True

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

    def draw_queries(self, std: float) -> None:
        """Query from N(0, std), as public research code leaves it (an ablation; both papers use zero)."""
        with torch.no_grad():
            self.query.normal_(0.0, std)

    def effective_query(self) -> torch.Tensor:
        """w * g (D,): query . RMSNorm_g(v) = inv_rms(v) * (w * g) . v, what the fast paths use."""
        return self.query * self.key_norm.weight

    def forward(self, sources: Sequence[torch.Tensor], need_weights: bool = True, impl: str = "reference",
                inv: Sequence[torch.Tensor] | None = None,
                prefix: RoutedPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """sources: n tensors (B, T, D) -> (gate * sum_i alpha_i V_i (B, T, D), alpha (B, T, n) fp32).

        impl: "reference", "lean", "triton", "fused" or "auto" (see `resolve_impl`); inv: each
        source's `inv_rms` (B, T) when the caller has them cached (fast paths only), else computed
        here (a prefix's merge computes the ones inv lacks).
        prefix: phase-1 routing of this router over sources[:prefix.num_sources], computed with
        its group (two-phase routing); only the remaining sources are read, merged by online softmax
        in one op (`merge_sources`, the C++ kernel when impl is "fused"). Weights are None when a
        prefix is merged and need_weights is False (they would cost a copy).
        """
        if impl not in ("reference", "lean"):  # the scheme passes these already resolved
            impl = resolve_impl(impl, sources[0].device)
        if prefix is not None:
            prefix = merge_remaining(prefix, list(sources), self.key_norm.eps, inv, need_weights, impl)
            return self.apply_gate(prefix.mixed), prefix.weights if need_weights else None
        if impl == "reference":
            mixed, weights = route_reference(self.query, self.key_norm.weight, sources, self.key_norm.eps)
        else:
            # Without cached inv_rms, route_fast computes them (the fused kernel in its own pass).
            mixed, _, weights = route_fast(self.effective_query()[None], list(sources),
                                           None if inv is None else list(inv), impl, eps=self.key_norm.eps)
            mixed, weights = mixed[0], weights[0]
        return self.apply_gate(mixed), weights

    def apply_gate(self, mixed: torch.Tensor) -> torch.Tensor:
        """gate * mixed when gated, else mixed unchanged."""
        return mixed if self.gate is None else self.gate.to(mixed.dtype) * mixed
