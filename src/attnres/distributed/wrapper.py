"""ParallelModel: what a training loop needs of a model set up on one rank, whatever the parallelism.

    parallel = wrap_model(model, mode, env, StepSettings(...), PipelineSettings(...))   # .wrap
    loss = parallel.train_step(next_batch)     # forward + backward of one optimizer step; gradients synced
    norm = parallel.clip_grad_norm(1.0)        # the global norm
    parallel.sync_parameters()                 # before evaluating or saving: the whole model current here
    val = [parallel.local_rows(b) for b in batches]

Subclasses: `DataParallel` (one process, DDP, FSDP2) and `PipelineParallel` (pipeline stages).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnres.common.checks import check_bool, check_choice, check_int
from attnres.common.precision import PRECISIONS
from attnres.model import AttnResLM

PARALLEL_MODES = ("none", "ddp", "fsdp", "pipeline")  # what wrap_model takes; runs add "auto"


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """How one optimizer step runs: precision ("bf16" autocast or "fp32"), grad_accum micro-steps per
    optimizer step, whether the forward is torch.compile'd, and the global batch of one micro-step
    (batch_size rows of seq_len tokens, split over the ranks or into pipeline micro-batches)."""

    precision: str = "bf16"
    grad_accum: int = 1
    compile: bool = False
    batch_size: int = 1
    seq_len: int = 1

    def __post_init__(self) -> None:
        check_choice(self.precision, "StepSettings.precision", PRECISIONS)
        for name in ("grad_accum", "batch_size", "seq_len"):
            check_int(getattr(self, name), f"StepSettings.{name}")
        check_bool(self.compile, "StepSettings.compile")


@dataclass
class ParallelModel:
    """A model set up for training on this rank.

    model: the AttnResLM (under FSDP its parameters are sharded DTensors, in place): build the
    optimizer from it, evaluate it, checkpoint it. mode: "none", "ddp", "fsdp" or "pipeline".
    device: where this rank computes.
    """

    model: AttnResLM
    mode: str
    device: torch.device

    def train_step(self, next_batch: Callable[[], torch.Tensor]) -> float:
        """Forward and backward of one optimizer step over global batches from next_batch() ((B, T) token
        ids, the same on every rank); gradients end synchronised in .grad. Returns the global mean loss,
        the same on every rank."""
        raise NotImplementedError

    def local_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """The part of a global (B, T) batch this rank computes on (the whole batch unless sharded by rows)."""
        return batch

    def trained_parameter_names(self) -> list[str] | None:
        """Names of the parameters this rank's optimizer updates; None: all of them."""
        return None

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """Scale the gradients so their global L2 norm is at most max_norm (None: only measure); returns
        the norm before clipping, identical on every rank."""
        raise NotImplementedError

    def sync_parameters(self) -> None:
        """Make every rank's whole model current before evaluating or saving (a no-op where it is)."""

    def step_metrics(self) -> dict:
        """Extra numbers of the last step for metrics.jsonl (none by default)."""
        return {}

    def inference_context(self):
        """Context for running the whole model outside the training step (diagnostics): none by default."""
        return contextlib.nullcontext()
