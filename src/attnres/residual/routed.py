"""Routed schemes (modes "replace" and "add"): each sub-layer's input mixes the sources of a
`SourcePolicy` (method §3), and the fast paths route static-query mixers in groups (method §5)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from attnres.common.errors import InputError
from attnres.residual.policy import SourcePolicy
from attnres.residual.scheme import ResidualScheme, StreamState, auto_chunk_size, check_chunk_size
from attnres.methods import DepthMixer
from attnres.routing import IMPLS, GroupRouting, RoutedPrefix, inv_rms, route_group
from attnres.routing.fused_cpu import collect_source


class FastRouting:
    """One pass's cache of the fast paths: inv_rms of each completed source (B, T), computed once
    when first needed (none with "fused", whose kernels compute them in their own passes), and the
    current group's phase-1 routing (two-phase routing, method §5), computed at its first mixer."""

    def __init__(self, impl: str, eps: float) -> None:
        self.impl, self.eps = impl, eps
        self.inv_rms: list[torch.Tensor] = []
        self.group: GroupRouting | None = None

    def collect(self, source: torch.Tensor) -> torch.Tensor:
        """A completed source as the routers will read it: under "fused", a view whose gradient from
        every routing call is summed by the kernels in one buffer (fused_cpu.collect_source)."""
        return collect_source(source) if self.impl == "fused" else source

    def completed_inv_rms(self, sources: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """inv_rms of every completed source, computing only the new ones; None for "fused", whose
        kernels compute each row's inverse RMS in the pass that reads it anyway (cheaper than a
        separate pass over every source and its autograd node, also when a source is routed again)."""
        if self.impl == "fused":
            return None
        for source in sources[len(self.inv_rms):]:
            self.inv_rms.append(inv_rms(source, self.eps))
        return self.inv_rms

    def prefix(self, s: int, first: int, mixers: Iterable[DepthMixer], sources: list[torch.Tensor]) -> RoutedPrefix:
        """Mixer s's phase-1 result: at its group's first mixer (`first`), all of the group's
        `mixers` (a lazy range of them: read only then) are routed over the sources completed so far
        in one call; later mixers reuse it. A state resumed inside a group (a pipeline stage) routes
        phase 1 over what it received."""
        if self.group is None or self.group.first != first:
            queries = [mixer.effective_query() for mixer in mixers]
            self.group = route_group(first, queries, sources, self.completed_inv_rms(sources), self.impl, eps=self.eps)
        return self.group.prefix(s - first)


class RoutedScheme(ResidualScheme):
    """mode "replace" (h_s = R_s(sources_s), a final mixer before the head, no running stream unless
    a mixer reads it) or "add" (h_s = x_s + R_s(sources_s), the standard stream runs on).

    Every sub-layer has a mixer, `routers[s]`, also where it sees a single source (a router's weight
    is then exactly 1 and its query gets zero gradient): mixer index equals sub-layer index; mode
    "replace" appends the final mixer last. Fast paths route static-query mixers in groups: each
    block of a block policy, and for a per-sub-layer policy (block_size 1) each chunk of
    `chunk_size` consecutive mixers, the final one included (`set_routing`).
    """

    def __init__(self, num_sublayers: int, policy: SourcePolicy, hidden_size: int, eps: float,
                 mixer: type[DepthMixer], mixer_options: dict | None = None, impls: tuple[str, ...] = IMPLS,
                 *, replace: bool) -> None:
        self.mode = "replace" if replace else "add"
        super().__init__(num_sublayers, policy, hidden_size, eps, mixer, mixer_options, impls)

    def build_mixers(self, mixer, hidden_size, eps, options):
        if options.get("gated") and self.mode != "add":
            raise ValueError("a gate only applies to additive routing (mode='add')")
        return [mixer(hidden_size, eps, **options) for _ in range(self.num_sublayers + (self.mode == "replace"))]

    def set_routing(self, impl: str = "auto", chunk_size: int | None = None, *, prefix: str = "",
                    error: type[Exception] = InputError) -> None:
        super().set_routing(impl, None, prefix=prefix, error=error)
        per_sublayer = self.policy.block_size == 1
        check_chunk_size(chunk_size, self.num_routers, per_sublayer, name=f"{prefix}routing_chunk_size", error=error)
        self.chunk_size = chunk_size or (auto_chunk_size(self.num_routers) if per_sublayer else 1)
        # Mixers routed in groups: chunks of chunk_size over every mixer (per-sub-layer policies),
        # or the blocks (the final mixer, which sees every block, routes alone).
        self.group_size = self.chunk_size if per_sublayer else self.policy.block_size
        self.num_grouped = self.num_routers if per_sublayer else self.num_sublayers

    @property
    def routes_fast(self) -> bool:
        return any(m.static_query for m in self.routers)

    @property
    def keeps_stream(self) -> bool:
        """x_s runs in mode "add", and in "replace" only for mixers that read it (`needs_stream`)."""
        return self.mode == "add" or any(m.needs_stream for m in self.routers)

    def _start(self, embedding: torch.Tensor, record_routing: bool) -> StreamState:
        return self.resume(embedding if self.keeps_stream else None, [embedding], None, record_routing)

    def resume(self, stream, sources, partial, record_routing=False) -> StreamState:
        state = super().resume(stream, sources, partial, record_routing)
        state.scratch = FastRouting(state.impl, self.eps)
        state.sources = [state.scratch.collect(v) for v in state.sources]
        return state

    def _sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        sources = state.sources
        if state.partial is not None and self.policy.partial_source:
            sources = sources + [state.partial]
        routed = self._mix(s, sources, state)
        return routed if self.mode == "replace" else state.stream + routed

    def _after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        """Advance the stream (where kept) and the block sums."""
        if state.stream is not None and self.policy.block_size > 1 and delta.dtype != state.stream.dtype:
            # Both sums take a bf16 delta in fp32: convert it once rather than in each add (and add
            # its two gradients in fp32 before the one conversion back).
            delta = delta.to(state.stream.dtype)
        if state.stream is not None:
            state.stream = state.stream + delta
        if state.partial is None:
            # Block sums accumulate in the stream's dtype (fp32 under autocast), like the standard
            # residual; a one-sub-layer block is the delta itself, kept as produced.
            state.partial = delta if self.policy.block_size == 1 else delta.to(state.sources[0].dtype)
        else:
            state.partial = state.partial + delta
        if self.policy.closes_block(s):
            state.sources.append(state.scratch.collect(state.partial))
            state.partial = None

    def _finish(self, state: StreamState) -> torch.Tensor:
        if self.mode == "replace":
            return self._mix(self.num_routers - 1, state.sources, state)
        return state.stream

    def source_names(self) -> list[list[str]]:
        names = [self.policy.source_names(s) for s in range(self.num_sublayers)]
        return names + ([self.policy.final_source_names()] if self.mode == "replace" else [])

    def _mix(self, index: int, sources: list[torch.Tensor], state: StreamState) -> torch.Tensor:
        """Mixer `index` over `sources` (B, T, D) each -> (B, T, D), with what it declares it can use:
        fast paths reuse the cached inv_rms, grouped mixers get their group's phase-1 result and
        merge only the sources that came after it."""
        mixer, fast = self.routers[index], state.scratch
        if not mixer.static_query:
            return self._call(index, sources, state, **({"stream": state.stream} if mixer.needs_stream else {}))
        if state.impl == "reference":
            return self._call(index, sources, state, impl="reference")
        inv = fast.completed_inv_rms(state.sources)  # None with "fused": its kernels compute them
        if self.group_size > 1 and index < self.num_grouped:
            # The merge computes the partial's inv_rms (the fused kernel in its own pass).
            first = index - index % self.group_size
            group = map(self.routers.__getitem__, range(first, min(first + self.group_size, self.num_grouped)))
            return self._call(index, sources, state, impl=state.impl, inv=inv,
                              prefix=fast.prefix(index, first, group, state.sources))
        if inv is not None:
            inv = inv + [inv_rms(v, self.eps) for v in sources[len(inv):]]  # the partial, if any
        return self._call(index, sources, state, impl=state.impl, inv=inv)
