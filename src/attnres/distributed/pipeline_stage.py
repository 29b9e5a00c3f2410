"""One pipeline stage: the module that runs a range of sub-layers, and the PipelineStage that counts bytes.

A stage's forward takes what the previous stage sent (see `pipeline_layout.Edge` for the order),
rebuilds the `StreamState`, runs its sub-layers with `AttnResLM.run_sublayers` (the same loop as
the full forward) and packs what the next stage needs; the first stage embeds, the last one
returns logits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from attnres.distributed.pipeline_layout import StageLayout
from attnres.distributed.stage_cache import ByteCounter, SourceCache
from attnres.model.decoder import AttnResLM
from attnres.residual import StreamState


class StageModule(nn.Module):
    """Stage `index` of `layout` over a shared `AttnResLM`.

    Only this stage's parameters are registered here (embedding, its layers and their routers, the
    final router, norm and head as applicable), so the schedule's per-stage gradient scaling touches
    each parameter once; the whole model is held outside the module tree to reuse its methods.
    `microbatch` is set by `CachedStage` before each forward (the cache is keyed by it).
    """

    def __init__(self, model: AttnResLM, layout: StageLayout, index: int, cache: SourceCache | None) -> None:
        super().__init__()
        self._model = (model,)  # a tuple, not an attribute nn.Module would register
        self.layout, self.index, self.cache = layout, index, cache
        self.is_first, self.is_last = index == 0, index == layout.num_stages - 1
        self.sublayers = layout.sublayers(index)
        first, last = layout.layer_bounds[index], layout.layer_bounds[index + 1]
        self.layers = nn.ModuleList(model.layers[first:last])
        self.routers = nn.ModuleList(model.routers[m] for m in model.residual.stage_mixers(first, last, self.is_last))
        self.embed_tokens = model.embed_tokens if self.is_first else None
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.microbatch = 0

    @property
    def model(self) -> AttnResLM:
        return self._model[0]

    def forward(self, *received: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """First stage: input_ids (B, T) int. Others: the previous edge's payload, each (B, T, D).
        Returns the next edge's payload (a tuple of (B, T, D)) or, on the last stage, logits (B, T, V)."""
        model = self.model
        state = model.residual.start(model.embed_tokens(received[0])) if self.is_first else self._unpack(received)
        reference = state.stream if state.stream is not None else state.sources[0]
        positions = torch.arange(reference.shape[1], device=reference.device)
        rope = model.rotary(positions, reference.dtype)
        if self.cache is not None and self.layout.has_later_local_stage(self.index):
            # One sub-layer at a time, so a block closed here is tapped before later sub-layers read it;
            # the sources taken from the cache are the earlier stage's, which tapped them.
            kept = self._keep(state, 0 if self.is_first else self.layout.edges[self.index - 1].first_sent)
            for s in self.sublayers:
                model.run_sublayers(state, s, s + 1, rope)
                kept = self._keep(state, kept)
        else:
            model.run_sublayers(state, self.sublayers.start, self.sublayers.stop, rope)
        return model.output_logits(state) if self.is_last else self._pack(state)

    def _keep(self, state: StreamState, start: int) -> int:
        """Tap and cache sources[start:] for this rank's later stages; returns how many are kept."""
        for i in range(start, len(state.sources)):
            state.sources[i] = self.cache.keep(self.microbatch, i, state.sources[i])
        return len(state.sources)

    def _unpack(self, received: tuple[torch.Tensor, ...]) -> StreamState:
        edge = self.layout.edges[self.index - 1]
        if len(received) != edge.num_tensors:
            raise RuntimeError(f"stage {self.index} expected {edge.num_tensors} tensors, received {len(received)}")
        items = list(received)
        stream = items.pop(0) if edge.has_stream else None
        partial = items.pop(0) if edge.has_partial else None
        cached = []
        if edge.first_sent:
            cached = self.cache.lookup(self.microbatch, edge.first_sent)
            if not self.layout.has_later_local_stage(self.index):
                self.cache.release(self.microbatch)  # no later stage on this rank reads them
        return self.model.residual.resume(stream, cached + items, partial)

    def _pack(self, state: StreamState) -> tuple[torch.Tensor, ...]:
        edge = self.layout.edges[self.index]
        if len(state.sources) != edge.num_sources or (state.partial is not None) != edge.has_partial:
            raise RuntimeError(f"stage {self.index} ends with {len(state.sources)} sources (partial: "
                               f"{state.partial is not None}); the layout expects {edge.num_sources} "
                               f"(partial: {edge.has_partial})")
        stream = [state.stream] if edge.has_stream else []
        partial = [state.partial] if edge.has_partial else []
        return tuple(stream + partial + state.sources[edge.first_sent:])


class CachedStage(PipelineStage):
    """A PipelineStage that tells its StageModule which micro-batch it runs, resets the rank's cache
    and byte counter at each step, and counts the bytes of every P2P send it builds."""

    def __init__(self, module: StageModule, counter: ByteCounter, tensor_bytes: int, **kwargs) -> None:
        super().__init__(module, module.index, module.layout.num_stages, **kwargs)
        self.counter, self.tensor_bytes = counter, tensor_bytes

    def forward_one_chunk(self, fwd_chunk_id: int, args, kwargs=None, save_forward_output: bool = True):
        # The schedules name the micro-batch only here; the module's cache lookups need it.
        self.submod.microbatch = fwd_chunk_id
        return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)

    def clear_runtime_states(self) -> None:
        super().clear_runtime_states()  # the schedules call this on every stage at the start of step()
        if self.submod.cache is not None:
            self.submod.cache.reset()
        self.counter.reset()

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        return self._counted("forward", self.stage_index, super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        return self._counted("backward", self.stage_index - 1, super().get_bwd_send_ops(bwd_chunk_id))

    def _counted(self, direction: str, edge: int, ops):
        """`ops`, their bytes across `edge` counted, with those the cache kept off it: the cached
        sources (their gradients, going back)."""
        if ops:
            saved = self.submod.layout.edges[edge].first_sent * self.tensor_bytes
            self.counter.record(direction, edge, ops, saved)
        return ops
