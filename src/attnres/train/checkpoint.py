"""Checkpoints: safetensors tensors plus a JSON state, written atomically, verified on load.

Layout of `<run>/checkpoints/step_<N>/`:
  model.safetensors      the model's parameters (tied tensors stored once)
  trainer.safetensors    optimizer moments and RNG states
  state.json             step, run config, scheduler, data position, optimizer hyper-parameters,
                         and the sha256 and size of both tensor files
  config.json            the model's Hugging Face config, so that
                         `AutoModelForCausalLM.from_pretrained(<checkpoint dir>)` loads it (import attnres.hf)
A checkpoint is built in a hidden temporary directory and renamed into place, so a process killed
mid-save leaves the previous checkpoints as they were and no half-written one.

Data-parallel runs write the same directories in torch.distributed.checkpoint's format instead of
the two safetensors files (format DCP_FORMAT; see attnres.distributed.checkpoint). Reading,
verification and `restore_model` accept both formats.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

FORMAT = "attnres-checkpoint-1"
DCP_FORMAT = "attnres-dcp-checkpoint-1"  # written by attnres.distributed.checkpoint
PREFIX = "step_"
TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or does not match the run that loads it."""


@dataclass
class Checkpoint:
    """A verified checkpoint on disk: its directory and parsed state.json."""

    path: Path
    state: dict

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def run_config(self) -> dict:
        return self.state["run_config"]

    @property
    def is_dcp(self) -> bool:
        """Whether the tensors are in torch.distributed.checkpoint files (a data-parallel run's)."""
        return self.state["format"] == DCP_FORMAT


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoint directories under `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler, run_config: dict, extra: dict, keep: int, hf_config: dict | None = None) -> Path:
    """Write checkpoint `step` atomically under `root`, then delete all but the newest `keep`.

    hf_config, when given, is written as config.json (see the module docstring)."""
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
                      "scalars": {f"{pid}.{k}": v for pid, e in opt_state["state"].items()
                                  for k, v in e.items() if not isinstance(v, torch.Tensor)}},
        "extra": extra,
        "files": {name: file_digest(tmp / name) for name in ("model.safetensors", "trainer.safetensors")},
    }
    publish(tmp, final, state, keep, hf_config)
    return final


def checkpoint_path(root: Path, step: int) -> Path:
    """Where checkpoint `step` lives under `root`: root/step_<8 digits>."""
    return root / f"{PREFIX}{step:08d}"


def fresh_tmp_dir(root: Path, name: str) -> Path:
    """Create the hidden directory `root/name` a checkpoint is built in, after removing the ones a
    process killed mid-save left behind. `name` must start with TMP_PREFIX."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / name
    tmp.mkdir()
    return tmp


def publish(tmp: Path, final: Path, state: dict, keep: int, hf_config: dict | None = None) -> None:
    """Finish a checkpoint built in `tmp`: write state.json (and config.json), flush everything to disk,
    rename `tmp` to `final` (replacing an older save of that step), keep the newest `keep`."""
    root = final.parent
    _write_json(tmp / "state.json", state)
    if hf_config is not None:
        _write_json(tmp / "config.json", hf_config)
    for file in tmp.iterdir():  # data on disk before the rename makes it visible
        _fsync(file)
    _fsync(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    for old in checkpoint_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def read_checkpoint(path: Path, verify: bool = True) -> Checkpoint:
    """Open and verify a checkpoint directory (state.json parses; file sizes and sha256 match).

    verify=False skips the digests (a caller that checks them itself, e.g. split over ranks)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (expected a directory with state.json)")
    try:
        state = json.loads((path / "state.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: state.json is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path} is corrupt: state.json does not parse ({error})") from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, DCP_FORMAT):
        raise CheckpointError(f"checkpoint {path} is not an attnres checkpoint (format {FORMAT!r} or "
                              f"{DCP_FORMAT!r} expected)")
    if verify:
        verify_files(path, state["files"], sorted(state["files"]))
    return Checkpoint(path, state)


def verify_files(path: Path, files: dict, names: list[str]) -> None:
    """Check that each of `names` in checkpoint `path` exists with the size and sha256 recorded in
    `files` (state.json's "files"); raise CheckpointError naming the first that does not."""
    for name in names:
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        if file_digest(file) != files[name]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its recorded "
                                  f"size and sha256")


def latest_checkpoint(root: Path, verify: bool = True) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, verified (unless verify=False); None when there is none."""
    dirs = checkpoint_dirs(root)
    return read_checkpoint(dirs[-1], verify) if dirs else None


def restore_model(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Load the checkpoint's weights into `model` (strict: every name and shape must match).

    `model` is a plain (not sharded) module; a data-parallel run's checkpoint is read whole."""
    if checkpoint.is_dcp:
        from attnres.distributed.checkpoint import load_model_state  # torch.distributed only when needed

        load_model_state(checkpoint, model)
        return
    try:
        missing, unexpected = load_model(model, str(checkpoint.path / "model.safetensors"), strict=False)
    except (SafetensorError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: {error}") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}")


def restore_training(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Load optimizer moments, scheduler position and RNG states saved with the checkpoint."""
    tensors = load_file(str(checkpoint.path / "trainer.safetensors"))
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


def file_digest(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest} of a file, as state.json records it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _write_json(path: Path, value: dict) -> None:
    with open(path, "w") as handle:
        json.dump(value, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
