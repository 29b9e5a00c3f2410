"""The Checkpointer: one object that saves a run's checkpoints in the format its parallelism writes
(`attnres.checkpoint.single` or `attnres.distributed.checkpoint`) and reads either back at any world
size and in any parallel mode, so the training loop never asks which one it has.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnres.checkpoint import single
from attnres.checkpoint.format import Checkpoint, latest_checkpoint
from attnres.distributed.env import current_env


def _dcp():
    # torch.distributed.checkpoint takes ~0.6 s to import; one-process runs never need it.
    from attnres.distributed import checkpoint

    return checkpoint


def restore_model(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Load a checkpoint of either format into a plain (not sharded) `model`; every name and shape must match."""
    if checkpoint.is_dcp:
        _dcp().load_model_state(checkpoint, model)
    else:
        single.restore_model(checkpoint, model)


class Checkpointer:
    """Checkpoints of one run under `root`, keeping the newest `keep`.

    parallel: how the run is wrapped ("none", "ddp", "fsdp" or "pipeline"). "none" writes the
    safetensors format; the others write DCP files from every rank (saving is then a collective)
    and record the parallel kind in state.json.
    """

    def __init__(self, root: Path, keep: int, parallel: str = "none") -> None:
        self.root, self.keep, self.parallel = Path(root), keep, parallel
        self.distributed = parallel != "none"

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, its files verified (in a process group the hashing is shared
        out and every rank gets the same answer or the same CheckpointError); None if there is none."""
        if current_env() is None:
            return latest_checkpoint(self.root)
        return _dcp().latest_checkpoint_shared(self.root)

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, run_config: dict,
             extra: dict, hf_files: dict[str, bytes] | None = None) -> Path:
        """Write checkpoint `step` atomically and drop old ones; returns its directory.

        `model` is whole (one process, or current on every rank) or FSDP-sharded; `extra` holds what
        else the run needs to resume (its data position). hf_files (the one-process format only:
        config.json, generation_config.json, the tokenizer) make the checkpoint load with transformers."""
        if not self.distributed:
            return single.save_checkpoint(self.root, step, model, optimizer, scheduler, run_config, extra,
                                          self.keep, hf_files=hf_files)
        return _dcp().save_dcp_checkpoint(self.root, step, model, optimizer, scheduler, run_config, extra,
                                          self.keep, self.parallel)

    restore_model = staticmethod(restore_model)  # either format into the whole model, before any sharding

    def restore_training(self, checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer,
                         scheduler) -> None:
        """Optimizer moments, scheduler position and RNG state of either format, into an optimizer over
        all of `model` or over this rank's part of it (plain, DDP's inner module or FSDP-sharded)."""
        if not self.distributed and not checkpoint.is_dcp:
            single.restore_training(checkpoint, optimizer, scheduler)
        else:
            _dcp().restore_training_state(checkpoint, model, optimizer, scheduler)
