"""The residual scheme: owns the stream between sub-layers. A source policy plus a routing mode.

It is also the drop-in API for a model loop of one's own (docs/how-to/drop-in.md):

    state = scheme.start(embedding)                # (B, T, D)
    for s, sublayer in enumerate(sublayers):        # 2L of them, attention and MLP alternating
        h = scheme.sublayer_input(s, state)         # routing happens here
        scheme.after(s, state, sublayer(norm_s(h))) # record the sub-layer's output delta_s
    hidden = scheme.finish(state)                  # the final mixer, where the variant has one

The scheme enforces this protocol: `start` takes a (B, T, hidden_size) embedding, the sub-layers come
in order 0, 1, ..., 2L - 1, each input read at most once and before its output is reported (a loop
may skip the read, e.g. a parallel block feeding one input to two sub-layers, except in mode
"streams", whose read computes the write), each output reported once, and `finish` comes once,
after the last sub-layer. Anything else raises `InputError` in one line naming the call expected.
The bookkeeping is two plain Python values on the state (`StreamState.next_sublayer`,
`input_read`), compared and updated per call: no tensor is read, so no device sync, and under
torch.compile they are constants of the trace (no graph break).

`ResidualScheme` is the interface and what every mode shares; one class per routing mode computes
it (`StandardScheme`, `RoutedScheme`, `AveragingScheme`, `StreamScheme`). Other packages ask the
scheme what they need to know of a variant (what a pipeline stage owns and sends, how to read a
mixer's sources, how to label its mixers) and never switch on a mode or a variant's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from attnres.common.checks import check_choice, check_int
from attnres.common.errors import InputError
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy
from attnres.methods import DepthMixer
from attnres.routing import IMPLS, resolve_impl



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
             mixer reads it; in mode "streams" the n residual streams, (B, T, n, D)); else None.
    sources: snapshots of completed sources, [e, block 1, block 2, ...], each (B, T, D).
    partial: sum of the current block's outputs so far; None at a block start.
    routing: the weights of each mixer called so far, when recording.
    impl:    the routing implementation for this pass ("reference", "lean", "triton" or "fused").
    scratch: what the scheme keeps for this pass only (the routed scheme's fast-path cache, the
             stream scheme's write coefficients).
    next_sublayer: the protocol's position, a plain int: the sub-layer whose input or output comes
             next (2L once all are done, 2L + 1 after `finish`); None for a state from `resume`
             until its first call, which then sets it.
    input_read: whether sub-layer next_sublayer's input has been read.
    """

    stream: torch.Tensor | None
    sources: list[torch.Tensor]
    partial: torch.Tensor | None = None
    routing: list[torch.Tensor | None] | None = None
    impl: str = "reference"
    scratch: object | None = None
    next_sublayer: int | None = None
    input_read: bool = False


class ResidualScheme(nn.Module):
    """The residual connections of 2L sub-layers: which sources each sub-layer's mixer sees (a source
    policy) and what the mixture does (the routing mode, one subclass each).

    mode "none":    h_s = x_s;                       x_{s+1} = x_s + delta_s; hidden = x_{2L}
    mode "replace": h_s = R_s(sources_s);            no running stream;  hidden = R_final(all blocks)
    mode "add":     h_s = x_s + R_s(sources_s);      x_{s+1} = x_s + delta_s; hidden = x_{2L}
    mode "average": h_s = x_s;  x_{s+1} = x_s + delta_s, and after a layer t that a `StatePolicy` names,
                    the stream becomes A_m(states x_j it reads) (DenseFormer); hidden = the stream
    mode "streams": n streams X (`StreamPolicy`); h_s = R_s(X) reads, X <- R_s.write(X, delta_s);
                    hidden = R_final(X) (hyper-connections, mHC; `attnres.methods.stream_mixer`)

    R is a `DepthMixer` (by default the `Router` of method §2), built as mixer(hidden_size, eps,
    **mixer_options) (the variant's options, `VariantOptions.mixer_options`); all parameters of a
    scheme are its mixers' (routing parameters). `impls` are the routing implementations the variant
    takes; `set_routing` chooses one, and a chunk size: how routing is computed, never what, and not
    part of the model.
    """

    mode: ClassVar[str]

    def __init__(self, num_sublayers: int, policy: SourcePolicy | StatePolicy | StreamPolicy | None, hidden_size: int,
                 eps: float, mixer: type[DepthMixer], mixer_options: dict | None = None,
                 impls: tuple[str, ...] = IMPLS) -> None:
        super().__init__()
        self.num_sublayers, self.policy, self.eps, self.impls = num_sublayers, policy, eps, impls
        self.hidden_size = hidden_size
        self.routers = nn.ModuleList(self.build_mixers(mixer, hidden_size, eps, dict(mixer_options or {})))
        self.set_routing()

    def build_mixers(self, mixer: type[DepthMixer], hidden_size: int, eps: float, options: dict) -> list[DepthMixer]:
        """The scheme's mixers, in calling order."""
        return []

    # ------------------------------------------------------------------ how routing is computed

    def set_routing(self, impl: str = "auto", chunk_size: int | None = None, *, prefix: str = "",
                    error: type[Exception] = InputError) -> None:
        """How routing is computed, never what: the routing implementation (one of `self.impls`, the
        variant's; `attnres.routing.IMPLS`) and, for a per-sub-layer policy, the chunk size of
        two-phase routing (None: `auto_chunk_size`; 1: every mixer routes alone over all its
        sources). Raises `error` naming `prefix` + routing_impl / routing_chunk_size for a value this
        scheme cannot use."""
        check_choice(impl, f"{prefix}routing_impl", self.impls, error=error)
        check_chunk_size(chunk_size, self.num_routers, False, name=f"{prefix}routing_chunk_size", error=error)
        self.impl = impl

    @property
    def routes_fast(self) -> bool:
        """Whether a fast routing path routes here; resolving "auto" says nothing of the fused CPU
        kernel otherwise."""
        return False

    # ------------------------------------------------------------------ the pass

    # The public calls check the protocol and hand over to the mode's `_start`, `_sublayer_input`,
    # `_after` and `_finish`, which subclasses override.

    def start(self, embedding: torch.Tensor, record_routing: bool = False) -> StreamState:
        """Initial state from the token embedding e (B, T, D), D = hidden_size."""
        if not isinstance(embedding, torch.Tensor):
            raise InputError(f"start() takes the embedding as a tensor (B, T, {self.hidden_size}), "
                             f"got {type(embedding).__name__}")
        if embedding.dim() != 3 or embedding.shape[-1] != self.hidden_size:
            raise InputError(f"start() takes the embedding as (B, T, {self.hidden_size}), the hidden_size this scheme "
                             f"was built with; got shape {tuple(embedding.shape)}")
        state = self._start(embedding, record_routing)
        state.next_sublayer, state.input_read = 0, False
        return state

    def _start(self, embedding: torch.Tensor, record_routing: bool) -> StreamState:
        return self.resume(embedding, [], None, record_routing)

    def resume(self, stream: torch.Tensor | None, sources: list[torch.Tensor], partial: torch.Tensor | None,
               record_routing: bool = False) -> StreamState:
        """A state part-way through the sub-layers, e.g. rebuilt by a pipeline stage from what it
        received: the stream (None where the scheme keeps none, `keeps_stream`), the completed
        sources, the partial or None."""
        device = (stream if stream is not None else sources[0]).device
        return StreamState(stream=stream, sources=sources, partial=partial,
                           routing=[] if record_routing and len(self.routers) else None,
                           impl=resolve_impl(self.impl, device, quiet=not self.routes_fast))

    def sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        """h_s (B, T, D): what sub-layer s normalises and transforms. Sub-layers come in order, each
        input read once, before `after(s, ...)`."""
        expected = state.next_sublayer
        if expected is None:  # a resumed state: its first call says where it is
            expected = state.next_sublayer = self._resumed_at(s, "sublayer_input")
        if s != expected or state.input_read or s >= self.num_sublayers:
            self._refuse(f"sublayer_input({s}, state)", state)
        state.input_read = True
        return self._sublayer_input(s, state)

    def after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        """Record sub-layer s's output delta_s (B, T, D), once, in order (its input read first, where
        the mode needs it)."""
        expected = state.next_sublayer
        if expected is None:
            expected = state.next_sublayer = self._resumed_at(s, "after")
        if s != expected or s >= self.num_sublayers or (self.needs_input_read and not state.input_read):
            self._refuse(f"after({s}, state, delta)", state)
        self._after(s, state, delta)
        state.next_sublayer, state.input_read = expected + 1, False

    def finish(self, state: StreamState) -> torch.Tensor:
        """The hidden state (B, T, D) fed to the final norm and the head: once, after the last
        sub-layer."""
        if state.next_sublayer is not None and state.next_sublayer != self.num_sublayers:
            self._refuse("finish(state)", state)
        hidden = self._finish(state)
        state.next_sublayer = self.num_sublayers + 1
        return hidden

    needs_input_read: ClassVar[bool] = False  # whether `after(s)` needs `sublayer_input(s)` first

    def _sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        return state.stream

    def _after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        state.stream = state.stream + delta

    def _finish(self, state: StreamState) -> torch.Tensor:
        return state.stream

    def _resumed_at(self, s: int, call: str) -> int:
        """The position of a resumed state, from its first call's sub-layer index."""
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < self.num_sublayers:
            raise InputError(f"{call}: the sub-layer index must be an integer from 0 to {self.num_sublayers - 1}, "
                             f"got {s!r}")
        return s

    def _refuse(self, call: str, state: StreamState) -> None:
        """Raise InputError naming `call` and the call the protocol expects instead."""
        n, total = state.next_sublayer, self.num_sublayers
        if n == total + 1:
            expected = "nothing more: finish(state) has run; start a new pass with start(embedding)"
        elif n == total:
            expected = f"finish(state): all {total} sub-layers are done"
        elif state.input_read:
            expected = f"after({n}, state, delta): sub-layer {n}'s input has been read, its output is next"
        else:
            expected = f"sublayer_input({n}, state): {n} of {total} sub-layers are done"
        raise InputError(f"{call} out of order; the next call is {expected} (sub-layers 0 to {total - 1} each "
                         f"take sublayer_input(s, state), then after(s, state, delta), in order, then finish(state))")

    def _call(self, index: int, mixer_input, state: StreamState, **extra) -> torch.Tensor:
        """Mixer `index` called as a module (hooks see every call) on its sources; records its weights."""
        record = state.routing is not None
        mixed, weights = self.routers[index](mixer_input, need_weights=record, **extra)
        if record:
            state.routing.append(weights)
        return mixed

    # ------------------------------------------------------------------ what others ask

    @property
    def num_routers(self) -> int:
        """How many mixers the scheme has."""
        return len(self.routers)

    @property
    def keeps_stream(self) -> bool:
        """Whether a (B, T, D) running stream flows between sub-layers (a pipeline stage sends it)."""
        return True

    @property
    def keeps_streams(self) -> bool:
        """Whether n residual streams (B, T, n, D) flow between sub-layers instead."""
        return False

    @property
    def source_size(self) -> int:
        """Sub-layers per completed source: where a pipeline stage boundary may fall without cutting
        one (1: anywhere)."""
        return 1 if self.policy is None else self.policy.block_size

    def source_names(self) -> list[list[str]]:
        """For each mixer in order, the names of the sources it sees (see `SourcePolicy`)."""
        return []

    mixer_axis: ClassVar[str] = "router (sub-layer)"  # what `mixer_labels` count, for a figure's axis

    def mixer_labels(self) -> list[str]:
        """A short label per mixer, for figures: "0 attn", "1 mlp", ..., "final"."""
        labels = [f"{s} {'attn' if s % 2 == 0 else 'mlp'}" for s in range(min(self.num_routers, self.num_sublayers))]
        return labels + ["final"] * (self.num_routers - len(labels))

    def stage_mixers(self, first_layer: int, last_layer: int, is_last: bool) -> list[int]:
        """The mixers a pipeline stage of layers [first_layer, last_layer) owns: its sub-layers' and,
        on the last stage, the final one."""
        owned = [s for s in range(2 * first_layer, 2 * last_layer) if s < self.num_routers]
        return owned + (list(range(self.num_sublayers, self.num_routers)) if is_last else [])

    def split_sources(self, mixer_input) -> list[torch.Tensor]:
        """The sources (B, T, D) each in a mixer's first argument (for analysis)."""
        return list(mixer_input)

    def join_sources(self, sources: list[torch.Tensor]):
        """The inverse of `split_sources`: a mixer's first argument from its sources."""
        return sources


class StandardScheme(ResidualScheme):
    """mode "none", the standard residual: h_s = x_s, x_{s+1} = x_s + delta_s. No mixers."""

    mode = "none"
