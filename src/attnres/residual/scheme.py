"""The residual scheme: owns the stream between sub-layers. A source policy plus a routing mode.

It is also the drop-in API for a model loop of one's own (docs/how-to/drop-in.md):

    state = scheme.start(embedding)                # (B, T, D)
    for s, sublayer in enumerate(sublayers):        # 2L of them, attention and MLP alternating
        h = scheme.sublayer_input(s, state)         # routing happens here
        scheme.after(s, state, sublayer(norm_s(h))) # record the sub-layer's output delta_s
    hidden = scheme.finish(state)                  # the final mixer, where the variant has one
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from attnres.common.checks import check_choice, check_int
from attnres.common.errors import InputError
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy
from attnres.routing import IMPLS, DepthMixer, GroupRouting, RoutedPrefix, Router, inv_rms, resolve_impl, route_group

MODES = ("none", "replace", "add", "average", "streams")


def auto_chunk_size(num_routers: int) -> int:
    """The chunk size C that per-sub-layer routing uses by default: round(sqrt(R)) for R routers.

    Phase 1 reads about R^2 / (2C) sources over a forward pass and phase 2 about R (C - 1) / 2;
    the sum is smallest at C = sqrt(R) (R = 2L + 1 for Full AttnRes, 2L for Delta AttnRes:
    C = 7 at 24 layers, 5 at 12, 10 at 48).
    """
    return max(1, round(math.sqrt(num_routers)))


def check_chunk_size(chunk_size: int | None, num_routers: int, per_sublayer: bool, *, name: str = "chunk_size",
                     applies_to: str = "per-sub-layer routing (full_attnres, delta_attnres; block variants route "
                                       "each block together)",
                     error: type[Exception] = InputError) -> None:
    """Raise `error` naming `name` unless chunk_size is None, or an integer from 1 to num_routers for a
    per-sub-layer policy (block policies group by block and take none)."""
    if chunk_size is None:
        return
    if not per_sublayer:
        raise error(f"{name} applies only to {applies_to}; leave it None here (got {chunk_size!r})")
    check_int(chunk_size, name, allow_none=True, error=error)
    if chunk_size > num_routers:
        raise error(f"{name} must be None (automatic) or an integer from 1 to the number of routers "
                    f"({num_routers}), got {chunk_size}")


@dataclass
class StreamState:
    """What flows between sub-layers during one forward pass.

    stream:  x_s, the running sum e + sum of outputs (modes "none" and "add", and "replace" when a
             mixer reads it); else None.
    sources: snapshots of completed sources, [e, block 1, block 2, ...], each (B, T, D).
    partial: sum of the current block's outputs so far; None at a block start.
    routing: the weights of each mixer called so far, when recording.
    impl:    the routing implementation for this pass ("reference", "lean", "triton" or "fused").
    inv_rms: fast paths: inv_rms of sources[i] (B, T), each computed once when first needed (empty
             with "fused", whose kernels compute them in their own passes).
    group:   two-phase paths: phase 1 of the current group's mixers (a block, or a chunk of
             per-sub-layer routers) over the sources completed before it, computed once, at the
             group's first sub-layer.
    written: mode "streams": the coefficients the current sub-layer's mixer computed when reading
             the streams, for writing its output back.

    In mode "streams" the stream is the n residual streams, (B, T, n, D).
    """

    stream: torch.Tensor | None
    sources: list[torch.Tensor]
    partial: torch.Tensor | None = None
    routing: list[torch.Tensor | None] | None = None
    impl: str = "reference"
    inv_rms: list[torch.Tensor] = field(default_factory=list)
    group: GroupRouting | None = None
    written: tuple | None = None


class ResidualScheme(nn.Module):
    """Standard, replacement or additive mixing of the sources a `SourcePolicy` names.

    mode "none":    h_s = x_s;                       x_{s+1} = x_s + delta_s; hidden = x_{2L}
    mode "replace": h_s = R_s(sources_s);            no running stream;  hidden = R_final(all blocks)
    mode "add":     h_s = x_s + R_s(sources_s);      x_{s+1} = x_s + delta_s; hidden = x_{2L}
    mode "average": h_s = x_s;  x_{s+1} = x_s + delta_s, and after a layer t that a `StatePolicy` names,
                    the stream becomes A_m(states x_j it reads) (DenseFormer); hidden = the stream
    mode "streams": n streams X (`StreamPolicy`); h_s = R_s.read(X), X <- R_s.write(X, delta_s);
                    hidden = R_final(X) (hyper-connections, mHC; `attnres.routing.hyper`)

    R is a `DepthMixer` (by default the `Router` of method §2), built as mixer(hidden_size, eps,
    **mixer_options) (the variant's options, `VariantOptions.mixer_options`). Every sub-layer of a routed scheme has one, `routers[s]`, also where it sees a
    single source (a router's weight is then exactly 1 and its query gets zero gradient): mixer
    index equals sub-layer index. Mode "replace" appends the final mixer last. Mode "average" has one
    mixer per averaging layer instead (`StatePolicy.mixer_layers`). All parameters of a scheme are
    its mixers' (routing parameters). Mode "streams" builds mixer(hidden_size, eps, num_streams=n,
    index=s) per sub-layer and `mixer.final(...)` last; any impl but "reference" takes the stream
    mixers' lean path (no normalised copy of the streams, docs/explanation/contenders.md).

    Fast paths route static-query mixers in groups (two-phase routing, method §5): each block of a
    block policy, and for a per-sub-layer policy (block_size 1) each chunk of `chunk_size`
    consecutive mixers, the final one included. `set_routing` chooses the implementation and the
    chunk size; they change how routing is computed, never what, and are not part of the model.
    """

    def __init__(self, num_sublayers: int, mode: str, policy: SourcePolicy | StatePolicy | None, hidden_size: int,
                 eps: float, mixer: type[DepthMixer] = Router, mixer_options: dict | None = None,
                 impls: tuple[str, ...] = IMPLS) -> None:
        super().__init__()
        check_choice(mode, "mode", MODES)
        if (mode == "none") != (policy is None):
            raise ValueError("a source policy is required exactly when mode is not 'none'")
        if (mode == "average") != isinstance(policy, StatePolicy):
            raise ValueError("mode 'average' takes a StatePolicy, and a StatePolicy takes mode 'average'")
        if (mode == "streams") != isinstance(policy, StreamPolicy) or (mode == "streams") != mixer.mixes_streams:
            raise ValueError("mode 'streams' takes a StreamPolicy and a stream mixer (mixes_streams), and they take it")
        if (mixer_options or {}).get("gated") and mode != "add":
            raise ValueError("a gate only applies to additive routing (mode='add')")
        self.num_sublayers = num_sublayers
        self.eps = eps
        self.mode = mode
        self.policy = policy
        self.impls = impls
        options = dict(mixer_options or {})
        if mode == "average":
            sizes = [len(policy.source_names(m)) for m in range(len(policy.mixer_layers))]
        else:
            sizes = [None] * (0 if mode == "none" else num_sublayers + (mode == "replace"))

        def build(num_sources: int | None) -> DepthMixer:
            sized = {"num_sources": num_sources} if mixer.takes_num_sources else {}
            return mixer(hidden_size, eps, **options, **sized)

        if mode == "streams":
            n = policy.num_streams
            self.routers = nn.ModuleList([*(mixer(hidden_size, eps, num_streams=n, index=s, **options)
                                            for s in range(num_sublayers)),
                                          mixer.final(hidden_size, eps, num_streams=n, **options)])
        else:
            self.routers = nn.ModuleList(build(n) for n in sizes)
        # x_s, the standard residual stream: the stream of modes "none" and "add", and in "replace"
        # what an input-dependent query reads (mixers with needs_stream).
        self.keeps_stream = mode != "replace" or any(m.needs_stream for m in self.routers)
        # Whether a fast routing path (routing_impl) routes here: static-query mixers of modes "add"
        # and "replace"; resolving "auto" says nothing of the fused CPU kernel otherwise.
        self.routes_fast = mode in ("add", "replace") and any(m.static_query for m in self.routers)
        self.set_routing()

    def set_routing(self, impl: str = "auto", chunk_size: int | None = None) -> None:
        """How routing is computed, never what: the routing implementation (one of `self.impls`, the
        variant's; `attnres.routing.IMPLS`) and, for a per-sub-layer policy, the chunk size of
        two-phase routing (None: `auto_chunk_size`; 1: every mixer routes alone over all its
        sources). Raises InputError naming the argument for a value this scheme cannot use."""
        check_choice(impl, "routing_impl", self.impls)
        num_mixers = len(self.routers)
        per_sublayer = isinstance(self.policy, SourcePolicy) and self.policy.block_size == 1
        check_chunk_size(chunk_size, num_mixers, per_sublayer, name="routing_chunk_size")
        self.impl = impl
        self.chunk_size = chunk_size or (auto_chunk_size(num_mixers) if per_sublayer else 1)
        # Mixers routed in groups: chunks of chunk_size over every mixer (per-sub-layer policies),
        # or the blocks (the final mixer, which sees every block, routes alone).
        self.group_size = self.chunk_size if per_sublayer else (self.policy.block_size
                                                                if isinstance(self.policy, SourcePolicy) else 1)
        self.num_grouped = num_mixers if per_sublayer else self.num_sublayers

    def start(self, embedding: torch.Tensor, record_routing: bool = False) -> StreamState:
        """Initial state from the token embedding e (B, T, D)."""
        if self.mode == "streams":  # n copies of the embedding
            n = self.policy.num_streams
            return self.resume(embedding.unsqueeze(-2).expand(*embedding.shape[:-1], n, embedding.shape[-1]), [],
                               None, record_routing)
        return self.resume(embedding if self.keeps_stream else None,
                           [] if self.mode == "none" else [embedding], None, record_routing)

    def resume(self, stream: torch.Tensor | None, sources: list[torch.Tensor], partial: torch.Tensor | None,
               record_routing: bool = False) -> StreamState:
        """A state part-way through the sub-layers, e.g. rebuilt by a pipeline stage from what it
        received: x_s (B, T, D), or None when the scheme keeps no stream (`keeps_stream`: mode
        "replace" without a mixer that reads it), the completed sources, the partial or None."""
        device = (stream if stream is not None else sources[0]).device
        if self.mode == "streams" and stream.dim() != 4:
            raise ValueError(f"mode 'streams' resumes from the streams (B, T, n, D), got shape {tuple(stream.shape)}")
        return StreamState(stream=stream, sources=sources, partial=partial,
                           routing=[] if record_routing and self.mode != "none" else None,
                           impl=resolve_impl(self.impl, device, quiet=not self.routes_fast))

    def sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        """h_s (B, T, D): what sub-layer s normalises and transforms."""
        if self.mode in ("none", "average"):
            return state.stream
        if self.mode == "streams":
            h, state.written = self._read(s, state)
            return h
        sources = state.sources
        if state.partial is not None and self.policy.partial_source:
            sources = sources + [state.partial]
        routed = self._mix(s, sources, state)
        return routed if self.mode == "replace" else state.stream + routed

    def after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        """Record sub-layer s's output delta_s (B, T, D): advance the stream and the block sums."""
        if self.mode == "streams":
            state.stream = self.routers[s].write(state.stream, delta, state.written)
            state.written = None
            return
        if state.stream is not None:
            state.stream = state.stream + delta
        if self.mode == "none":
            return
        if self.mode == "average":
            if s % 2:  # layer s // 2 + 1 ends: its output is a state; an average may replace the stream
                layer = s // 2 + 1
                state.sources.append(state.stream)
                m = self.policy.mixer_after(layer)
                if m is not None:
                    chosen = [state.sources[j] for j in self.policy.state_indices(layer)]
                    state.stream = self._mix(m, chosen, state)
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
            return self._mix(len(self.routers) - 1, state.sources, state)
        if self.mode == "streams":
            return self._read(len(self.routers) - 1, state)[0]
        return state.stream

    def source_names(self) -> list[list[str]]:
        """For each mixer in order, the names of the sources it sees (see `SourcePolicy`)."""
        if self.policy is None:
            return []
        if self.mode in ("average", "streams"):
            return [self.policy.source_names(m) for m in range(len(self.routers))]
        names = [self.policy.source_names(s) for s in range(self.num_sublayers)]
        return names + ([self.policy.final_source_names()] if self.mode == "replace" else [])

    def _mix(self, index: int, sources: list[torch.Tensor], state: StreamState) -> torch.Tensor:
        """Mixer `index` over `sources` (B, T, D) each -> (B, T, D), called as a module (hooks see
        every call), with what it declares it can use: fast paths reuse the cached inv_rms, grouped
        mixers get their group's phase-1 result and merge only the sources that came after it."""
        mixer = self.routers[index]
        record = state.routing is not None
        if not mixer.static_query:
            extra = {"stream": state.stream} if mixer.needs_stream else {}
            mixed, weights = mixer(sources, need_weights=record, **extra)
        elif state.impl == "reference":
            mixed, weights = mixer(sources, need_weights=record, impl="reference")
        else:
            inv = self._completed_inv_rms(state)  # None with "fused": its kernels compute them
            if self.group_size > 1 and index < self.num_grouped:
                # The merge computes the partial's inv_rms (the fused kernel in its own pass).
                mixed, weights = mixer(sources, need_weights=record, impl=state.impl, inv=inv,
                                       prefix=self._group_prefix(index, state))
            else:
                if inv is not None:
                    inv = inv + [inv_rms(v, self.eps) for v in sources[len(inv):]]  # the partial, if any
                mixed, weights = mixer(sources, need_weights=record, impl=state.impl, inv=inv)
        if record:
            state.routing.append(weights)
        return mixed

    def _read(self, index: int, state: StreamState) -> tuple[torch.Tensor, tuple]:
        """Stream mixer `index` reads the streams (B, T, n, D): (h (B, T, D), its write coefficients);
        records its read weights (B, T, n) when recording."""
        record = state.routing is not None
        h, weights, written = self.routers[index](state.stream, need_weights=record, lean=state.impl != "reference")
        if record:
            state.routing.append(weights)
        return h, written

    def _group_prefix(self, s: int, state: StreamState) -> RoutedPrefix:
        """Mixer s's phase-1 result (method §5): at its group's first mixer, all of the group's
        mixers are routed over the sources completed so far in one call; later mixers reuse it.
        A state resumed inside a group (a pipeline stage) routes phase 1 over what it received."""
        size = self.group_size
        first = s - s % size
        if state.group is None or state.group.first != first:
            mixers = [self.routers[i] for i in range(first, min(first + size, self.num_grouped))]  # a slice builds a ModuleList
            queries = torch.stack([mixer.effective_query() for mixer in mixers])
            state.group = route_group(first, queries, state.sources, self._completed_inv_rms(state), state.impl,
                                      eps=self.eps)
        return state.group.prefix(s - first)

    def _completed_inv_rms(self, state: StreamState) -> list[torch.Tensor] | None:
        """inv_rms of every completed source (B, T) each, computing only the new ones; None for "fused",
        whose kernels compute each row's inverse RMS in the pass that reads it anyway (cheaper than a
        separate pass over every source and its autograd node, also when a source is routed again)."""
        if state.impl == "fused":
            return None
        for source in state.sources[len(state.inv_rms):]:
            state.inv_rms.append(inv_rms(source, self.eps))
        return state.inv_rms
