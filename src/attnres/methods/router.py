"""The Router: one static pseudo-query and one key norm per routed input (method §2), and the Kimi
paper's router ablations (method §7) as options of the same module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnres.common.checks import check_bool, check_choice
from attnres.common.precision import autocast_off
from attnres.norm import RMSNorm, unit_rms
from attnres.methods.depth_mixer import DepthMixer, MixerFlops
from attnres.methods.options import VariantOptions, option
from attnres.routing.reference import route_reference
from attnres.routing.route import resolve_impl, route_fast
from attnres.routing.two_phase import RoutedPrefix, merge_remaining

# Router ablations (method §7; `RouterOptions`).
QUERY_KINDS = ("static", "input_dependent")
WEIGHT_KINDS = ("softmax", "sigmoid")


@dataclass(frozen=True, kw_only=True)
class RouterOptions(VariantOptions):
    """The options of every variant routed by `Router`s: the Kimi paper's router ablations (method §7).
    The defaults are the method's router; an ablated one computes with the reference code only."""

    query: str = option("static", "the pseudo-query: 'static' (method §2) or 'input_dependent' (w + W_q x_s)",
                        choices=QUERY_KINDS, label="[input query]", mixer="query")
    weights: str = option("softmax", "the routing weights: 'softmax' over the sources or independent 'sigmoid's",
                          choices=WEIGHT_KINDS, label="[{value}]", mixer="weights")
    key_norm: bool = option(True, "RMS-normalise the keys (the sources) before scoring",
                            label="[no key norm]", mixer="key_norm")

    def fast_paths(self) -> bool:
        """The fast and two-phase paths compute the method's router only."""
        return all(getattr(self, name) == default for name, default in RouterOptions.defaults().items())


class Router(DepthMixer):
    """R(w, g; V_1 ... V_n) of method §2, optionally scaled by a scalar gate.

    Parameters: `query` (D,) initialised to zero, so the weights start uniform; `key_norm.weight`
    (D,) initialised to one; `gate` () initialised to zero when `gated` (Delta Block's exact
    conversion, method §4), else None.

    Ablations (the Kimi paper's, method §7), each off by default:
      query="input_dependent": the query is w + W_q unit_rms(x_s), with x_s the sub-layer's current
          input (the standard residual stream, `needs_stream`) and `query_proj` W_q (D, D)
          initialised to zero, so the model at initialisation is the static-query one;
      weights="sigmoid": alpha_i = sigmoid(z_i), not normalised over the sources;
      key_norm=False: keys are the raw sources (no RMSNorm, no `key_norm` parameter).
    An ablated router computes with the reference code (`route_reference`); the fast and two-phase
    paths serve the default router only (`static_query`).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False, query: str = "static",
                 weights: str = "softmax", key_norm: bool = True) -> None:
        super().__init__()
        check_choice(query, "Router query", QUERY_KINDS)
        check_choice(weights, "Router weights", WEIGHT_KINDS)
        check_bool(key_norm, "Router key_norm")
        self.query_kind, self.weight_kind, self.eps = query, weights, eps
        self.query = nn.Parameter(torch.zeros(hidden_size))
        self.key_norm = RMSNorm(hidden_size, eps) if key_norm else None
        self.query_proj = nn.Parameter(torch.zeros(hidden_size, hidden_size)) if query == "input_dependent" else None
        self.gate = nn.Parameter(torch.zeros(())) if gated else None

    @property
    def static_query(self) -> bool:
        """True for the router of method §2 (static query, softmax, RMS-normalised keys): the scheme
        may route it with the fast and two-phase paths."""
        return self.query_proj is None and self.weight_kind == "softmax" and self.key_norm is not None

    @property
    def needs_stream(self) -> bool:
        """True when the query reads the sub-layer's current input (query="input_dependent")."""
        return self.query_proj is not None

    def reset_parameters(self) -> None:
        """Zero query (and query map), unit key gain, zero gate: the initialisation both papers prescribe."""
        nn.init.zeros_(self.query)
        if self.key_norm is not None:
            self.key_norm.reset_parameters()
        if self.query_proj is not None:
            nn.init.zeros_(self.query_proj)
        if self.gate is not None:
            nn.init.zeros_(self.gate)

    def draw_queries(self, std: float) -> None:
        """Query from N(0, std), as public research code leaves it (an ablation; both papers use zero)."""
        with torch.no_grad():
            self.query.normal_(0.0, std)

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """Scores (a D-dot product per source) and the weighted sum: 4 n D, elementwise on every path;
        the input-dependent query adds its D x D map, a matrix product (2 D^2)."""
        d = self.query.shape[0]
        return MixerFlops(matmul=0 if self.query_proj is None else 2 * d * d, vector=4 * num_sources * d)

    def effective_query(self) -> torch.Tensor:
        """w * g (D,): query . RMSNorm_g(v) = inv_rms(v) * (w * g) . v, what the fast paths use."""
        return self.query * self.key_norm.weight

    def forward(self, sources: Sequence[torch.Tensor], need_weights: bool = True, impl: str = "reference",
                inv: Sequence[torch.Tensor] | None = None, prefix: RoutedPrefix | None = None,
                stream: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """sources: n tensors (B, T, D) -> (gate * sum_i alpha_i V_i (B, T, D), alpha (B, T, n) fp32).

        impl: "reference", "lean", "triton", "fused" or "auto" (see `resolve_impl`); inv: each
        source's `inv_rms` (B, T) when the caller has them cached (fast paths only), else computed
        here (a prefix's merge computes the ones inv lacks).
        prefix: phase-1 routing of this router over sources[:prefix.num_sources], computed with
        its group (two-phase routing); only the remaining sources are read, merged by online softmax
        in one op (`merge_sources`, the C++ kernel when impl is "fused"). Weights are None when a
        prefix is merged and need_weights is False (they would cost a copy).
        stream: x_s (B, T, D), the sub-layer's current input; required when `needs_stream`.
        """
        if not self.static_query:
            return self._forward_ablated(sources, impl, inv, prefix, stream)
        if impl not in ("reference", "lean"):  # the scheme passes these already resolved
            impl = resolve_impl(impl, sources[0].device)
        if prefix is not None:
            prefix = merge_remaining(prefix, list(sources), self.eps, inv, need_weights, impl)
            return self.apply_gate(prefix.mixed), prefix.weights if need_weights else None
        if impl == "reference":
            mixed, weights = route_reference(self.query, self.key_norm.weight, sources, self.eps)
        else:
            # Without cached inv_rms, route_fast computes them (the fused kernel in its own pass).
            mixed, _, weights = route_fast(self.effective_query()[None], list(sources),
                                           None if inv is None else list(inv), impl, eps=self.eps)
            mixed, weights = mixed[0], weights[0]
        return self.apply_gate(mixed), weights

    def _forward_ablated(self, sources, impl, inv, prefix, stream) -> tuple[torch.Tensor, torch.Tensor]:
        if impl != "reference" or inv is not None or prefix is not None:
            raise ValueError("an ablated router (query='input_dependent', weights='sigmoid' or key_norm=False) "
                             "computes with the reference code only; call it with impl='reference' and no "
                             "inv or prefix")
        query = self.query
        if self.query_proj is not None:
            if stream is None:
                raise ValueError("a router with query='input_dependent' needs stream= (the sub-layer's "
                                 "current input, (B, T, D))")
            # The input's RMS grows with depth; normalised, W_q sees inputs of one scale everywhere.
            # fp32 (autocast off), like the logits: a bf16 query would round every logit it makes.
            with autocast_off(stream.device):
                u = unit_rms(stream, self.eps)
                query = query.to(u.dtype) + u @ self.query_proj.to(u.dtype).T
        key_gain = None if self.key_norm is None else self.key_norm.weight
        mixed, weights = route_reference(query, key_gain, sources, self.eps, weights=self.weight_kind)
        return self.apply_gate(mixed), weights

    def apply_gate(self, mixed: torch.Tensor) -> torch.Tensor:
        """gate * mixed when gated, else mixed unchanged."""
        return mixed if self.gate is None else self.gate.to(mixed.dtype) * mixed
