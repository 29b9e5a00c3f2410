"""The residual scheme: owns the stream between sub-layers. A source policy plus a routing mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from attnres.residual.policy import SourcePolicy
from attnres.routing import Router

RoutingMode = Literal["none", "replace", "add"]


@dataclass
class StreamState:
    """What flows between sub-layers during one forward pass.

    stream:  x_s, the running sum e + sum of outputs (modes "none" and "add"); None in "replace".
    sources: snapshots of completed sources, [e, block 1, block 2, ...], each (B, T, D).
    partial: sum of the current block's outputs so far; None at a block start.
    routing: the weights of each router called so far, when recording.
    """

    stream: torch.Tensor | None
    sources: list[torch.Tensor]
    partial: torch.Tensor | None = None
    routing: list[torch.Tensor] | None = None


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
                 hidden_size: int, eps: float, gated: bool = False) -> None:
        super().__init__()
        if mode not in ("none", "replace", "add"):
            raise ValueError(f"mode must be one of ['none', 'replace', 'add'], got {mode!r}")
        if (mode == "none") != (policy is None):
            raise ValueError("a source policy is required exactly when mode is not 'none'")
        if gated and mode != "add":
            raise ValueError("a gate only applies to additive routing (mode='add')")
        self.num_sublayers = num_sublayers
        self.mode = mode
        self.policy = policy
        num_routers = 0 if mode == "none" else num_sublayers + (mode == "replace")
        self.routers = nn.ModuleList(Router(hidden_size, eps, gated=gated) for _ in range(num_routers))

    def start(self, embedding: torch.Tensor, record_routing: bool = False) -> StreamState:
        """Initial state from the token embedding e (B, T, D)."""
        return StreamState(
            stream=None if self.mode == "replace" else embedding,
            sources=[] if self.mode == "none" else [embedding],
            routing=[] if record_routing and self.mode != "none" else None)

    def sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        """h_s (B, T, D): what sub-layer s normalises and transforms."""
        if self.mode == "none":
            return state.stream
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

    @staticmethod
    def _route(router: Router, sources: list[torch.Tensor], state: StreamState) -> torch.Tensor:
        mixed, weights = router(sources)
        if state.routing is not None:
            state.routing.append(weights)
        return mixed
