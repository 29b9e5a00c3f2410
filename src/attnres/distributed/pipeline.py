"""Pipeline parallelism for AttnResLM on torch.distributed.pipelining, with cross-stage caching.

    pipe = build_pipeline(model, PipelineConfig(schedule="interleaved1f1b", stages_per_rank=2,
                                                num_microbatches=4, microbatch_size=2, seq_len=128))
    loss = pipe.step(input_ids, labels)   # every rank calls it; loss on the last stage's rank
    pipe.counter.totals()                 # bytes sent this step, forward and backward

Every rank builds the whole model from the same seed or state dict; each stage registers and
trains only its own parameters (`owned_parameter_names`). See docs/explanation/pipeline.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from attnres.distributed.pipeline_layout import PipelineConfig, StageLayout, build_layout, tensor_bytes
from attnres.distributed.pipeline_stage import CachedStage, StageModule
from attnres.distributed.stage_cache import ByteCounter, SourceCache
from attnres.model.decoder import AttnResLM, next_token_loss

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}


@dataclass
class Pipeline:
    """What `build_pipeline` returns: the schedule, this rank's stages, its byte counter, the layout."""

    model: AttnResLM
    config: PipelineConfig
    layout: StageLayout
    schedule: object
    stages: list[CachedStage]
    counter: ByteCounter
    group: dist.ProcessGroup | None = None

    @property
    def has_first(self) -> bool:
        return any(stage.is_first for stage in self.stages)

    @property
    def has_last(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def step(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor | None:
        """One training step's forward and backward (no optimizer step); every rank of the group calls it.

        input_ids (M * b, T) on the rank of stage 0 and labels (M * b, T) on the rank of the last stage
        (M micro-batches of b rows, T = seq_len; other ranks may pass them too, they are ignored).
        Gradients end in the owned parameters' .grad, scaled to the mean over micro-batches.
        Returns the mean loss over micro-batches on the last stage's rank, None elsewhere.
        """
        args = (self._checked("input_ids", input_ids),) if self.has_first else ()
        target = self._checked("labels", labels) if self.has_last else None
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=target, losses=losses if self.has_last else None, return_outputs=False)
        if self.model.config.tie_embeddings:
            self._sum_tied_grad()
        return torch.stack(losses).mean() if self.has_last else None

    def owned_parameter_names(self) -> list[str]:
        """Names (as in model.named_parameters()) of the parameters this rank's stages train."""
        owned = {id(p) for stage in self.stages for p in stage.submod.parameters()}
        return [name for name, p in self.model.named_parameters() if id(p) in owned]

    def _checked(self, name: str, tensor: torch.Tensor | None) -> torch.Tensor:
        c = self.config
        shape = (c.num_microbatches * c.microbatch_size, c.seq_len)
        if tensor is None or tuple(tensor.shape) != shape:
            got = None if tensor is None else tuple(tensor.shape)
            raise ValueError(f"Pipeline.step: {name} must have shape {shape} (num_microbatches * microbatch_size, "
                             f"seq_len) on this rank, got {got}")
        return tensor

    def _sum_tied_grad(self) -> None:
        """Tied embedding/head weight: stage 0 and the last stage run on different ranks and each
        holds part of its gradient; sum the parts (a collective on the group)."""
        weight = self.model.embed_tokens.weight
        grad = weight.grad if weight.grad is not None and (self.has_first or self.has_last) else None
        total = grad.clone() if grad is not None else torch.zeros_like(weight)
        dist.all_reduce(total, group=self.group)
        if self.has_first or self.has_last:
            weight.grad = total


def build_pipeline(model: AttnResLM, config: PipelineConfig, group: dist.ProcessGroup | None = None) -> Pipeline:
    """Cut `model` into P * V stages (P = ranks of `group`, V = config.stages_per_rank) and build the schedule.

    Loss: mean next-token cross-entropy per micro-batch (`next_token_loss`), averaged over
    micro-batches by the schedule's gradient scaling. Tensors crossing a transition are
    (microbatch_size, seq_len, hidden_size) in the model's parameter dtype.
    """
    if not dist.is_initialized():
        raise RuntimeError("build_pipeline needs an initialised process group (torch.distributed.init_process_group)")
    num_ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = build_layout(model.config, config, num_ranks)
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    cache = SourceCache() if config.cache else None
    counter = ByteCounter(layout.num_stages - 1, device)
    nbytes = tensor_bytes(model.config, config, parameter.element_size())
    stages = []
    for index in range(rank, layout.num_stages, num_ranks):
        module = StageModule(model, layout, index, cache)
        inputs, outputs = _example_io(model, config, layout, index, dtype)
        stages.append(CachedStage(module, counter, nbytes, device=device, input_args=inputs,
                                  output_args=outputs, group=group))
    schedule_class = _SCHEDULES[config.schedule]
    target = stages if config.schedule == "interleaved1f1b" else stages[0]
    schedule = schedule_class(target, config.num_microbatches, loss_fn=next_token_loss)
    return Pipeline(model, config, layout, schedule, stages, counter, group)


def _example_io(model: AttnResLM, config: PipelineConfig, layout: StageLayout, index: int,
                dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Meta-device tensors with the shapes each stage receives and sends: static metadata, so no
    stage is run just to discover shapes. Activations require grad, so gradients travel back."""
    b, t = config.microbatch_size, config.seq_len

    def payload(edge: int) -> tuple[torch.Tensor, ...]:
        count = layout.edges[edge].num_tensors
        return tuple(torch.empty(b, t, model.config.hidden_size, dtype=dtype, device="meta", requires_grad=True)
                     for _ in range(count))

    inputs = (torch.empty(b, t, dtype=torch.long, device="meta"),) if index == 0 else payload(index - 1)
    if index == layout.num_stages - 1:
        outputs = (torch.empty(b, t, model.config.vocab_size, dtype=dtype, device="meta", requires_grad=True),)
    else:
        outputs = payload(index)
    return inputs, outputs
