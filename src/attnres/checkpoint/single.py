"""The one-process checkpoint: model.safetensors and trainer.safetensors (see `attnres.checkpoint.format`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from attnres.checkpoint.format import (FORMAT, TMP_PREFIX, Checkpoint, CheckpointError, checkpoint_path, file_digest,
                                       fresh_tmp_dir, parameter_names, publish)


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler, run_config: dict, extra: dict, keep: int, hf_files: dict[str, bytes] | None = None
                    ) -> Path:
    """Write checkpoint `step` atomically under `root`, then delete all but the newest `keep`.

    hf_files, {name: content} (`attnres.checkpoint.hf_dir.hf_directory_files`), are written beside
    the tensors so the checkpoint loads with transformers (see the format's docstring)."""
    final = checkpoint_path(root, step)
    tmp = fresh_tmp_dir(root, f"{TMP_PREFIX}{final.name}-{os.getpid()}")
    save_model(model, str(tmp / "model.safetensors"))
    opt_state = optimizer.state_dict()
    tensors = {f"optim.{pid}.{key}": value.detach().contiguous()
               for pid, entry in opt_state["state"].items() for key, value in entry.items()
               if isinstance(value, torch.Tensor)}
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = rng
    save_file(tensors, str(tmp / "trainer.safetensors"))
    state = {
        "format": FORMAT, "step": step, "run_config": run_config,
        "scheduler": scheduler.state_dict(),
        "optimizer": {"param_groups": opt_state["param_groups"],
                      "param_names": parameter_names(model, optimizer),
                      "scalars": {f"{pid}.{k}": v for pid, e in opt_state["state"].items()
                                  for k, v in e.items() if not isinstance(v, torch.Tensor)}},
        "extra": extra,
        "files": {name: file_digest(tmp / name) for name in ("model.safetensors", "trainer.safetensors")},
    }
    publish(tmp, final, state, keep, hf_files)
    return final


def restore_model(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Load a one-process checkpoint's weights into `model` (strict: every name and shape must match)."""
    try:
        missing, unexpected = load_model(model, str(checkpoint.path / "model.safetensors"), strict=False)
    except (SafetensorError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: {error}") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}")


def restore_training(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Load optimizer moments, scheduler position and RNG states saved with a one-process checkpoint
    into an optimizer over the same parameters in the same order."""
    tensors = read_trainer_tensors(checkpoint)
    saved = checkpoint.state["optimizer"]
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            per_param.setdefault(int(pid), {})[name] = value
    for key, value in saved["scalars"].items():
        pid, name = key.split(".", 1)
        per_param.setdefault(int(pid), {})[name] = value
    try:
        optimizer.load_state_dict({"state": per_param, "param_groups": saved["param_groups"]})
    except (ValueError, KeyError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: optimizer state does not fit: {error}") from None
    scheduler.load_state_dict(checkpoint.state["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)


def read_trainer_tensors(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """trainer.safetensors of a one-process checkpoint (optimizer state by position, RNG states)."""
    return load_file(str(checkpoint.path / "trainer.safetensors"))
