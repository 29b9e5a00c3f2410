"""The residual scheme: owns the stream between sub-layers. A source policy plus a routing mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from attnres.residual.policy import SourcePolicy
from attnres.routing import IMPLS, Router, inv_rms, resolve_impl, route_fast
from attnres.routing.lean import autocast_off

RoutingMode = Literal["none", "replace", "add"]


@dataclass
class StreamState:
    """What flows between sub-layers during one forward pass.

    stream:  x_s, the running sum e + sum of outputs (modes "none" and "add"); None in "replace".
    sources: snapshots of completed sources, [e, block 1, block 2, ...], each (B, T, D).
    partial: sum of the current block's outputs so far; None at a block start.
    routing: the weights of each router called so far, when recording.
    impl:    the routing implementation for this pass ("reference", "lean" or "triton").
    inv_rms: fast paths: inv_rms of sources[i] (B, T), each computed once when first needed.
    phase1:  fast block paths: (first sub-layer, effective queries, mixed, lse, weights) of the
             current block's routers over its completed sources, computed once at the block's first
             sub-layer.
    """

    stream: torch.Tensor | None
    sources: list[torch.Tensor]
    partial: torch.Tensor | None = None
    routing: list[torch.Tensor] | None = None
    impl: str = "reference"
    inv_rms: list[torch.Tensor] | None = None
    phase1: tuple | None = None


class ResidualScheme(nn.Module):
    """Standard, replacement or additive routing over the sources a `SourcePolicy` names.

    mode "none":    h_s = x_s;                       x_{s+1} = x_s + delta_s; hidden = x_{2L}
    mode "replace": h_s = R_s(sources_s);            no running stream;  hidden = R_final(all blocks)
    mode "add":     h_s = x_s + R_s(sources_s);      x_{s+1} = x_s + delta_s; hidden = x_{2L}

    Every sub-layer of a routed scheme has a router, `routers[s]`, also where it sees a single
    source (its weight is then exactly 1 and its query gets zero gradient): router index equals
    sub-layer index. Mode "replace" appends the final router last.
    """

    def __init__(self, num_sublayers: int, mode: RoutingMode, policy: SourcePolicy | None,
                 hidden_size: int, eps: float, gated: bool = False, impl: str = "auto") -> None:
        super().__init__()
        if mode not in ("none", "replace", "add"):
            raise ValueError(f"mode must be one of ['none', 'replace', 'add'], got {mode!r}")
        if (mode == "none") != (policy is None):
            raise ValueError("a source policy is required exactly when mode is not 'none'")
        if gated and mode != "add":
            raise ValueError("a gate only applies to additive routing (mode='add')")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {list(IMPLS)}, got {impl!r}")
        self.num_sublayers = num_sublayers
        self.eps = eps
        self.impl = impl
        self.mode = mode
        self.policy = policy
        num_routers = 0 if mode == "none" else num_sublayers + (mode == "replace")
        self.routers = nn.ModuleList(Router(hidden_size, eps, gated=gated) for _ in range(num_routers))

    def start(self, embedding: torch.Tensor, record_routing: bool = False) -> StreamState:
        """Initial state from the token embedding e (B, T, D)."""
        return self.resume(None if self.mode == "replace" else embedding,
                           [] if self.mode == "none" else [embedding], None, record_routing)

    def resume(self, stream: torch.Tensor | None, sources: list[torch.Tensor], partial: torch.Tensor | None,
               record_routing: bool = False) -> StreamState:
        """A state part-way through the sub-layers, e.g. rebuilt by a pipeline stage from what it
        received: x_s (B, T, D) or None in "replace" mode, the completed sources, the partial or None."""
        device = (stream if stream is not None else sources[0]).device
        return StreamState(stream=stream, sources=sources, partial=partial,
                           routing=[] if record_routing and self.mode != "none" else None,
                           impl=resolve_impl(self.impl, device), inv_rms=[])

    def sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        """h_s (B, T, D): what sub-layer s normalises and transforms."""
        if self.mode == "none":
            return state.stream
        if state.impl != "reference" and self.policy.block_size > 1:
            routed = self._route_two_phase(s, state)
        else:
            sources = state.sources
            if state.partial is not None and self.policy.partial_source:
                sources = sources + [state.partial]
            routed = self._route(self.routers[s], sources, state)
        return routed if self.mode == "replace" else state.stream + routed

    def after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        """Record sub-layer s's output delta_s (B, T, D): advance the stream and the block sums."""
        if state.stream is not None:
            state.stream = state.stream + delta
        if self.mode == "none":
            return
        if state.partial is None:
            # Block sums accumulate in the stream's dtype (fp32 under autocast), like the standard
            # residual; a one-sub-layer block is the delta itself, kept as produced.
            state.partial = delta if self.policy.block_size == 1 else delta.to(state.sources[0].dtype)
        else:
            state.partial = state.partial + delta
        if self.policy.closes_block(s):
            state.sources.append(state.partial)
            state.partial = None

    def finish(self, state: StreamState) -> torch.Tensor:
        """The hidden state (B, T, D) fed to the final norm and the head."""
        if self.mode == "replace":
            return self._route(self.routers[-1], state.sources, state)
        return state.stream

    def source_names(self) -> list[list[str]]:
        """For each router in order, the names of the sources it sees (see `SourcePolicy`)."""
        if self.policy is None:
            return []
        names = [self.policy.source_names(s) for s in range(self.num_sublayers)]
        return names + ([self.policy.final_source_names()] if self.mode == "replace" else [])

    def _route(self, router: Router, sources: list[torch.Tensor], state: StreamState) -> torch.Tensor:
        """One router over `sources` (B, T, D) each -> (B, T, D); fast paths reuse cached inv_rms."""
        inv = None
        if state.impl != "reference":
            inv = self._completed_inv_rms(state)
            inv = inv + [inv_rms(v, self.eps) for v in sources[len(inv):]]  # the partial, if any
        mixed, weights = router(sources, impl=state.impl, inv=inv)
        if state.routing is not None:
            state.routing.append(weights)
        return mixed

    def _route_two_phase(self, s: int, state: StreamState) -> torch.Tensor:
        """METHOD §5: phase 1 routes all of a block's routers over its completed sources in one call
        at the block's first sub-layer; phase 2 merges each router's result with the current
        partial sum by online softmax (Delta Block without a partial source needs phase 1 only)."""
        size = self.policy.block_size
        first = s - s % size
        if state.phase1 is None or state.phase1[0] != first:
            routers = self.routers[first:min(first + size, self.num_sublayers)]
            queries = torch.stack([router.effective_query() for router in routers])
            inv = self._completed_inv_rms(state)
            state.phase1 = (first, queries, *route_fast(queries, state.sources, inv, state.impl))
        _, queries, mixed_all, lse_all, weights_all = state.phase1
        j = s - first
        mixed, lse, weights = mixed_all[j], lse_all[j], weights_all[j]
        if state.partial is not None and self.policy.partial_source:
            mixed, weights = self._merge_partial(queries[j], mixed, lse, weights, state.partial,
                                                 record=state.routing is not None)
        if state.routing is not None:
            state.routing.append(weights)
        return self.routers[s].apply_gate(mixed)

    def _merge_partial(self, query: torch.Tensor, mixed: torch.Tensor, lse: torch.Tensor, weights: torch.Tensor,
                       partial: torch.Tensor, record: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Online-softmax merge of phase 1 (mixed (B, T, D), lse (B, T), weights (B, T, n)) with the
        partial source (B, T, D) as one more key; query (D,) is the router's effective query.
        Returns (mixed, weights (B, T, n + 1) or None)."""
        width = partial.shape[-1]
        with autocast_off(partial.device):  # fp32 logits, like the reference
            query = query.to(lse.dtype)
            logit = (partial.reshape(-1, width).to(lse.dtype) @ query).reshape(lse.shape)
            logit = logit * inv_rms(partial, self.eps)
            total = torch.logaddexp(lse, logit)
            keep, take = torch.exp(lse - total), torch.exp(logit - total)
            merged = keep.unsqueeze(-1) * mixed + take.unsqueeze(-1) * partial
        merged = merged.to(torch.promote_types(mixed.dtype, partial.dtype))
        if not record:
            return merged, None
        return merged, torch.cat([weights * keep.unsqueeze(-1), take.unsqueeze(-1)], dim=-1)

    def _completed_inv_rms(self, state: StreamState) -> list[torch.Tensor]:
        """inv_rms of every completed source (B, T) each, computing only the new ones."""
        for source in state.sources[len(state.inv_rms):]:
            state.inv_rms.append(inv_rms(source, self.eps))
        return state.inv_rms
