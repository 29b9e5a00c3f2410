"""Distributed checkpoints: model and optimizer tensors in torch.distributed.checkpoint (DCP) files.

The layout, digests and publication are `attnres.checkpoint.format`'s. A run in a process group
(DDP, FSDP2, pipeline) writes `<run>/checkpoints/step_N/` as:
  .metadata, __<rank>_<i>.distcp   DCP files: "model.<name>" (every parameter and buffer by its
                                   name, tied ones under both names), "optim.<name>.<step|exp_avg|
                                   exp_avg_sq>" (AdamW state by parameter name), "rng.torch"
  state.json                       format DCP_FORMAT, step, run config, scheduler, data position,
                                   optimizer hyper-parameters (param_groups by parameter name), the
                                   writer's world size and parallel kind, size and sha256 of each file
Tensors are stored by name and global shape, so DCP re-shards them on load: for FSDP on any number
of ranks, for DDP, and for a single process (`attnres eval`, `--resume` without torchrun).

Like the single-process format the directory is built in a hidden temporary directory and renamed
by rank 0 after every rank has written its files. Only tensors go into the DCP files (no pickled
Python objects), and `.metadata` is read with an unpickler that admits only DCP's metadata classes.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict, get_state_dict,
                                                     set_optimizer_state_dict)

from attnres.checkpoint.format import (DCP_FORMAT, TMP_PREFIX, Checkpoint, CheckpointError, checkpoint_path,
                                       file_digest, fresh_tmp_dir, latest_checkpoint, publish, verify_files)
from attnres.checkpoint.single import optimizer_state_by_position, read_trainer_tensors, restore_training
from attnres.distributed.env import all_gather_objects, barrier, current_env, is_main


def save_dcp_checkpoint(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                        run_config: dict, extra: dict, keep: int, parallel: str) -> Path:
    """Write checkpoint `step` under `root` from every rank (a collective: all ranks call it), then
    keep the newest `keep`. `model` is the AttnResLM (FSDP-sharded, DDP's inner module, or whole
    and current on every rank under a pipeline). Each rank's optimizer may hold its own subset of
    the parameters (pipeline stages): each saves the state it has, and state.json lists the union."""
    final = checkpoint_path(root, step)
    tmp = root / f"{TMP_PREFIX}{final.name}-dcp"  # one name for all ranks (pids differ)
    if is_main():
        fresh_tmp_dir(root, tmp.name)
    barrier()
    model_state, optim_state = get_state_dict(model, optimizer)  # local shards, nothing gathered
    dcp.save({"model": model_state, "optim": optim_state["state"], "rng": {"torch": torch.get_rng_state()}},
             checkpoint_id=tmp)
    mine = {name: file_digest(tmp / name) for name in _my_share(sorted(p.name for p in tmp.iterdir()))}
    files = dict(sorted(item for part in all_gather_objects(mine) for item in part.items()))
    param_groups = _merged_param_groups(optim_state["param_groups"])
    if is_main():
        env = current_env()
        state = {"format": DCP_FORMAT, "step": step, "run_config": run_config,
                 "scheduler": scheduler.state_dict(), "optimizer": {"param_groups": param_groups},
                 "extra": extra, "world_size": env.world_size if env else 1, "parallel": parallel, "files": files}
        publish(tmp, final, state, keep)
    barrier()  # nobody moves on (or saves again) before the checkpoint is in place
    return final


def latest_checkpoint_shared(root: Path) -> Checkpoint | None:
    """latest_checkpoint with the digest checks shared out: rank r hashes files r, r + W, ...
    The same result, or the same CheckpointError, on every rank."""
    checkpoint = latest_checkpoint(root, verify=False)
    if checkpoint is not None:
        try:
            verify_files(checkpoint.path, checkpoint.state["files"], _my_share(sorted(checkpoint.state["files"])))
            problem = None
        except CheckpointError as error:
            problem = str(error)
        problems = [p for p in all_gather_objects(problem) if p is not None]
        if problems:
            raise CheckpointError(problems[0])
    return checkpoint


def load_model_state(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Load a DCP checkpoint's weights into a plain (unsharded) `model`; every name and shape must
    match. A collective when a process group is initialised (every rank reads the whole model)."""
    state = model.state_dict()  # tensors share storage with the parameters: DCP loads in place
    metadata = _read_metadata(checkpoint.path / ".metadata").state_dict_metadata
    saved = {key.removeprefix("model."): meta for key, meta in metadata.items() if key.startswith("model.")}
    missing, unexpected = sorted(set(state) - set(saved)), sorted(set(saved) - set(state))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: missing {missing}, "
                              f"unexpected {unexpected}")
    wrong = [f"{name}: checkpoint {tuple(saved[name].size)}, model {tuple(tensor.shape)}"
             for name, tensor in state.items() if tuple(saved[name].size) != tuple(tensor.shape)]
    if wrong:
        raise CheckpointError(f"checkpoint {checkpoint.path} does not fit this model: " + "; ".join(wrong))
    _load(checkpoint, {"model": state})


def restore_training_state(checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer,
                           scheduler) -> None:
    """Optimizer moments, scheduler position and RNG state from a checkpoint of either format into
    the optimizer of `model` (plain, DDP's inner module or FSDP-sharded), at any world size. An
    optimizer over part of the model (a pipeline rank's stages) takes the state of its parameters."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if checkpoint.is_dcp:
        current = get_optimizer_state_dict(model, optimizer)  # the structure to fill, sharded as now
        request = {"optim": current["state"], "rng": {"torch": torch.get_rng_state()}}
        _load(checkpoint, request)
        full = False
        optim_state = {"state": request["optim"], "param_groups": checkpoint.state["optimizer"]["param_groups"]}
        rng = request["rng"]["torch"]
    elif all(id(p) in held and not isinstance(p, DTensor) for p in model.parameters()):
        restore_training(checkpoint, optimizer, scheduler)  # all parameters, whole: the single-process reader
        return
    else:  # a single-process checkpoint into sharded parameters or part of the model: by name, whole tensors
        optim_state, rng = _named_optimizer_state(checkpoint)
        full = True
    try:
        set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=full))
    except (KeyError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: optimizer state does not fit: {error}") from None
    scheduler.load_state_dict(checkpoint.state["scheduler"])
    torch.set_rng_state(rng)


def _named_optimizer_state(checkpoint: Checkpoint):
    """trainer.safetensors (state keyed by position in the optimizer) keyed by parameter name instead.

    The one-process writer records each param group's parameter names (state.json's
    optimizer.param_names); positions count through the groups in order, whatever part of the model
    this rank's optimizer holds."""
    saved = checkpoint.state["optimizer"]
    if "param_names" not in saved:
        raise CheckpointError(f"checkpoint {checkpoint.path} was written by an attnres that did not record "
                              f"parameter names; resume it once in one process (or with DDP) and save, then "
                              f"continue with this parallel mode")
    order = [name for names in saved["param_names"] for name in names]
    tensors = read_trainer_tensors(checkpoint)
    by_position = optimizer_state_by_position(tensors, saved["scalars"])
    state = {order[pid]: entry for pid, entry in by_position.items()}
    groups = [{**group, "params": [order[pid] for pid in group["params"]]} for group in saved["param_groups"]]
    return {"state": state, "param_groups": groups}, tensors["rng.torch"]


def _merged_param_groups(groups: list[dict]) -> list[dict]:
    """Every rank's param_groups (parameters by name) merged by group name: each group with the
    union of its parameters, in rank order (a collective). Ranks that hold the same parameters
    (DDP, FSDP) get their own groups back."""
    merged: dict[str, dict] = {}
    for rank_groups in all_gather_objects(groups):
        for group in rank_groups:
            into = merged.setdefault(group.get("name", len(merged)), {**group, "params": []})
            into["params"] += [name for name in group["params"] if name not in into["params"]]
    return list(merged.values())


def _load(checkpoint: Checkpoint, state: dict) -> None:
    try:
        with warnings.catch_warnings():  # a single-process load is intended, not a mistake to warn of
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=checkpoint.path, storage_reader=_SafeReader(checkpoint.path))
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001  (DCP wraps per-rank failures in its own exception types)
        raise CheckpointError(f"checkpoint {checkpoint.path} could not be loaded: {error}") from None


def _my_share(names: list[str]) -> list[str]:
    """The names this rank handles when work is shared out: r, r + W, ... (all in a single process)."""
    env = current_env()
    return names[env.rank::env.world_size] if env else names


# What DCP's .metadata pickle may name: its own metadata records, torch sizes, dtypes and layouts,
# and paths. Anything else (a crafted file) is refused instead of executed.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "ChunkStorageMetadata",
                                              "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = name in _METADATA_CLASSES.get(module, ())
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")
        return super().find_class(module, name)


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader, but `.metadata` is first unpickled with _MetadataUnpickler."""

    def read_metadata(self, *args, **kwargs):
        _read_metadata(Path(self.path) / ".metadata")  # raises before anything unsafe is unpickled
        return super().read_metadata(*args, **kwargs)


def _read_metadata(path: Path):
    try:
        with open(path, "rb") as handle:
            return _MetadataUnpickler(handle).load()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path.parent} is incomplete: .metadata is missing") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as error:
        raise CheckpointError(f"checkpoint {path.parent} is corrupt: .metadata does not read as DCP "
                              f"metadata ({error})") from None
