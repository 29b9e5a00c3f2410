"""Pipeline parallelism as a `ParallelModel` (`train.parallel: pipeline`; see docs/explanation/pipeline.md).

Every rank builds the whole model from the same seed or checkpoint; `build_pipeline` gives each
rank its stages, and a training loop drives `PipelineParallel` through the interface it uses for DDP
and FSDP. One pipeline spans all ranks of the process group (no data parallelism across pipelines).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from attnres.distributed.env import all_gather_objects, all_reduce_sum, broadcast_value
from attnres.distributed.pipeline import Pipeline, build_pipeline
from attnres.distributed.pipeline_layout import PipelineConfig
from attnres.distributed.stage_cache import PipelineBytes
from attnres.distributed.wrapper import ParallelModel
from attnres.model import AttnResLM


@dataclass
class PipelineParallel(ParallelModel):
    """A model cut into pipeline stages on this rank (built by `wrap_pipeline`).

    pipe: the Pipeline (schedule, this rank's stages, byte counter). owners: {parameter name: the
    lowest rank that trains it}; a parameter trained on two ranks (the tied embedding and head,
    updated identically on both) is counted in the gradient norm and broadcast by that one rank.
    """

    pipe: Pipeline | None = None
    owners: dict[str, int] = field(default_factory=dict)
    current: bool = True  # whether every rank's whole model holds the latest update
    last_bytes: PipelineBytes | None = None

    def train_step(self, next_batch: Callable[[], torch.Tensor]) -> float:
        """Forward and backward of the global batch next_batch() (B, T) = (num_microbatches x
        microbatch_size, seq_len), called once on every rank; gradients end in the owned parameters.

        Returns the mean loss over micro-batches (= the batch's mean loss: every row has T - 1
        targets), taken from the last stage's rank so every rank sees the same value and stops on
        the same non-finite step."""
        batch = next_batch().to(self.device)
        self.model.zero_grad(set_to_none=True)  # also gradients left on parameters other ranks train
        loss = self.pipe.step(batch, batch)
        self.current = False
        self.last_bytes = self.pipe.counter.totals()  # a collective: every rank, every step
        last_rank = self.pipe.layout.rank_of(self.pipe.layout.num_stages - 1)
        return broadcast_value(float(loss) if loss is not None else math.nan, src=last_rank)

    def trained_parameter_names(self) -> list[str]:
        """Names of the parameters of this rank's stages (model.named_parameters() names)."""
        return self.pipe.owned_parameter_names()

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """`ParallelModel.clip_grad_norm` of the owned gradients: each rank adds the squared norm of
        those it counts (owners[name] == rank), the sum is all-reduced in float64; the scaling is
        torch's own (`clip_grads_with_norm_`)."""
        rank = dist.get_rank()
        owned = set(self.trained_parameter_names())
        params = [(name, p) for name, p in self.model.named_parameters() if name in owned and p.grad is not None]
        counted = [p.grad for name, p in params if self.owners[name] == rank]
        local = float(torch.nn.utils.get_total_norm(counted)) if counted else 0.0
        total = math.sqrt(all_reduce_sum(local ** 2))
        if max_norm is not None and params:
            norm = torch.tensor(total, dtype=params[0][1].grad.dtype)
            torch.nn.utils.clip_grads_with_norm_([p for _, p in params], max_norm, norm)
        return total

    @torch.no_grad()
    def sync_parameters(self) -> None:
        """Make every rank's whole model current (a collective; nothing to do until the next step):
        each parameter broadcast in place from its owner, one by one in named_parameters() order (the
        same on every rank), so no flat copy of the model is held; it runs only before evaluation
        and checkpoints."""
        if not self.current:
            for name, param in self.model.named_parameters():
                dist.broadcast(param.detach(), src=self.owners[name])
            self.current = True

    def step_metrics(self) -> dict:
        """The last step's P2P bytes summed over ranks: forward and backward sent, and what the
        cross-stage cache kept off the wire in both directions (what cache=false would add)."""
        b = self.last_bytes
        if b is None:
            return {}
        saved = (b.forward_uncached - b.forward_sent) + (b.backward_uncached - b.backward_sent)
        return {"pipe/fwd_bytes": b.forward_sent, "pipe/bwd_bytes": b.backward_sent, "pipe/saved_bytes": saved}


def wrap_pipeline(model: AttnResLM, config: PipelineConfig) -> PipelineParallel:
    """Cut `model` (whole and identical on every rank, weights final) into the stages of `config` over
    all ranks. A collective (every rank calls it); raises PipelineConfigError for a split that does
    not fit the model or the world."""
    pipe = build_pipeline(model, config)
    owners: dict[str, int] = {}  # {name: the lowest rank that trains it}, from every rank's names
    for rank, names in enumerate(all_gather_objects(pipe.owned_parameter_names())):
        for name in names:
            owners.setdefault(name, rank)
    missing = [name for name, _ in model.named_parameters() if name not in owners]
    if missing:  # a parameter no stage trains would silently stay at its initial value
        raise RuntimeError(f"pipeline stages leave parameters without an owner: {missing}")
    device = next(model.parameters()).device
    return PipelineParallel(model, "pipeline", device, pipe=pipe, owners=owners)

