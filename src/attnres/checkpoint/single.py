"""The one-process checkpoint: model.safetensors and trainer.safetensors (see `attnres.checkpoint.format`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from attnres.common.atomic import naming_failures
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
    try:
        with naming_failures(tmp / "model.safetensors"):
            save_model(model, str(tmp / "model.safetensors"))
        opt_state = optimizer.state_dict()
        tensors = {f"optim.{pid}.{key}": value.detach().contiguous()
                   for pid, entry in opt_state["state"].items() for key, value in entry.items()
                   if isinstance(value, torch.Tensor)}
        tensors["rng.torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            for i, rng in enumerate(torch.cuda.get_rng_state_all()):
                tensors[f"rng.cuda.{i}"] = rng
        with naming_failures(tmp / "trainer.safetensors"):
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
        with naming_failures(tmp):
            publish(tmp, final, state, keep, hf_files)
    except BaseException:  # a full disk, an interrupt: the partial folder goes, the last whole checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    try:
        for key, value in saved["scalars"].items():
            if not _same_kind(value, 0.0):
                raise ValueError(f"optimizer scalar {key!r} is {value!r}, not a number")
        per_param = optimizer_state_by_position(tensors, saved["scalars"])
        current = optimizer.state_dict()["param_groups"]
        if not _same_kind(saved["param_groups"], current):
            raise ValueError(f"param_groups {saved['param_groups']!r:.200} do not match the optimizer's "
                             f"{current!r:.200}")
        optimizer.load_state_dict({"state": per_param, "param_groups": saved["param_groups"]})
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: optimizer state does not fit: {error}") from None
    current = scheduler.state_dict()
    scheduler_state = dict(checkpoint.state["scheduler"])
    wrong = [key for key in current if key in scheduler_state and not _same_kind(scheduler_state[key], current[key])]
    if wrong:
        raise CheckpointError(f"checkpoint {checkpoint.path}: scheduler state does not fit: {wrong} in state.json "
                              f"are not what this run's scheduler holds")
    if "rng.torch" not in tensors:
        raise CheckpointError(f"checkpoint {checkpoint.path}: trainer.safetensors holds no RNG state (rng.torch)")
    try:
        scheduler.load_state_dict(scheduler_state)
        torch.set_rng_state(tensors["rng.torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: scheduler or RNG state does not fit: {error}") from None
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)


def _same_kind(saved, current) -> bool:
    """Whether `saved` (read from state.json) has the JSON shape of `current` (what the optimizer or
    scheduler holds now): numbers for numbers, lists of the same length, objects whose common keys do
    (a key only one of them has is left to torch: another torch version may add or drop one)."""
    if current is None or isinstance(current, bool):
        return saved is None or isinstance(saved, bool)
    if isinstance(current, (int, float)):
        return isinstance(saved, (int, float)) and not isinstance(saved, bool)
    if isinstance(current, (list, tuple)):
        return isinstance(saved, list) and len(saved) == len(current) and all(map(_same_kind, saved, current))
    if isinstance(current, dict):
        return isinstance(saved, dict) and all(_same_kind(saved[key], current[key]) for key in saved.keys() & current)
    return isinstance(saved, type(current))


def optimizer_state_by_position(tensors: dict[str, torch.Tensor], scalars: dict) -> dict[int, dict]:
    """{parameter position: {state name: value}} from trainer.safetensors' "optim.<pos>.<name>" tensors
    and state.json's optimizer "scalars" ("<pos>.<name>")."""
    state: dict[int, dict] = {}
    entries = [(key.removeprefix("optim."), v) for key, v in tensors.items() if key.startswith("optim.")]
    for key, value in entries + list(scalars.items()):
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    return state


def read_trainer_tensors(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """trainer.safetensors of a one-process checkpoint (optimizer state by position, RNG states)."""
    try:
        return load_file(str(checkpoint.path / "trainer.safetensors"))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: trainer.safetensors is corrupt or unreadable ({error}); "
                              f"resume from another checkpoint") from None
