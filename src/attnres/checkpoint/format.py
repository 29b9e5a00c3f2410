"""The checkpoint format: directory layout, digests, atomic publication, reading and verification.

Layout of `<run>/checkpoints/step_<N>/`:
  model.safetensors      the model's parameters (tied tensors stored once)        one-process format
  trainer.safetensors    optimizer moments and RNG states                          one-process format
  .metadata, __*.distcp  torch.distributed.checkpoint files (model, optimizer, RNG) distributed format
  state.json             format, step, run config, scheduler, data position, optimizer hyper-parameters
                         (param_groups, with each group's parameter names), the size and sha256 of
                         every tensor file
  config.json            the model's Hugging Face config with its special-token ids, generation_config.json
  tokenizer.json, ...    and the run's tokenizer (one-process format; `attnres.checkpoint.hf_dir`), so that
                         `AutoModelForCausalLM.from_pretrained(<checkpoint dir>)` (import attnres.hf) and
                         `AutoTokenizer.from_pretrained(<checkpoint dir>)` load it

A checkpoint is built in a hidden temporary directory and renamed into place (`publish`), so a
process killed mid-save leaves the previous checkpoints as they were and no half-written one. The
writers of the two tensor formats are `attnres.checkpoint.single` (one process) and
`attnres.distributed.checkpoint` (a process group); `attnres.distributed.Checkpointer` picks one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from attnres.common import atomic

FORMAT = "attnres-checkpoint-1"
DCP_FORMAT = "attnres-dcp-checkpoint-1"
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


def publish(tmp: Path, final: Path, state: dict, keep: int, hf_files: dict[str, bytes] | None = None) -> None:
    """Finish a checkpoint built in `tmp`: write state.json (and `hf_files`, {name: content}), flush
    everything to disk, rename `tmp` to `final` (replacing an older save of that step), keep the newest `keep`."""
    root = final.parent
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    for name, content in (hf_files or {}).items():
        (tmp / name).write_bytes(content)
    for file in tmp.iterdir():  # data on disk (state.json included) before the rename makes it visible
        _fsync(file)
    _fsync(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    atomic.publish(tmp, final)
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
    except (OSError, ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise CheckpointError(f"checkpoint {path} is corrupt: state.json does not parse ({error})") from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, DCP_FORMAT):
        raise CheckpointError(f"checkpoint {path} is not an attnres checkpoint (format {FORMAT!r} or "
                              f"{DCP_FORMAT!r} expected)")
    _check_state(path, state)
    if verify:
        verify_files(path, state["files"], sorted(state["files"]))
    return Checkpoint(path, state)


def _check_state(path: Path, state: dict) -> None:
    """CheckpointError naming the first key of state.json that is missing or of the wrong type (what
    the writers put there, which the readers use without looking again)."""
    def problem(key: str, expected: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} is corrupt: state.json's {key} must be {expected}, got "
                               f"{state.get(key)!r:.200}")

    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise problem("step", "an integer >= 0")
    for key in ("run_config", "scheduler", "optimizer", "extra", "files"):
        if not isinstance(state.get(key), dict):
            raise problem(key, "a JSON object")
    for section in ("model", "data", "train"):  # the run's sections, which resume compares field by field
        if not isinstance(state["run_config"].get(section, {}), dict):
            raise CheckpointError(f"checkpoint {path} is corrupt: state.json's run_config.{section} must be a JSON "
                                  f"object, got {state['run_config'][section]!r:.200}")
    if not isinstance(state["optimizer"].get("param_groups"), list):
        raise problem("optimizer", "an object with a 'param_groups' list")
    if state["format"] == FORMAT and not isinstance(state["optimizer"].get("scalars"), dict):
        raise problem("optimizer", "an object with a 'scalars' object")
    listed = {FORMAT: ("model.safetensors", "trainer.safetensors"), DCP_FORMAT: (".metadata",)}[state["format"]]
    if not all(name in state["files"] for name in listed):
        raise problem("files", f"an object listing {', '.join(listed)}")
    for name, digest in state["files"].items():
        if Path(name).name != name or name in ("", ".", ".."):  # a file of this directory, nothing outside it
            raise problem("files", f"an object keyed by file names of the checkpoint directory (not {name!r})")
        if not (isinstance(digest, dict) and isinstance(digest.get("bytes"), int)
                and isinstance(digest.get("sha256"), str)):
            raise problem("files", f'an object of {{"bytes": int, "sha256": str}} (not {digest!r} for {name!r})')


def verify_files(path: Path, files: dict, names: list[str]) -> None:
    """Check that each of `names` in checkpoint `path` exists with the size and sha256 recorded in
    `files` (state.json's "files"); raise CheckpointError naming the first that does not."""
    for name in names:
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        if file_digest(file) != files[name]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its recorded "
                                  f"size and sha256; use another checkpoint of the run (keep_checkpoints keeps "
                                  f"the last few)")


def latest_checkpoint(root: Path, verify: bool = True) -> Checkpoint | None:
    """The newest checkpoint under `root`, verified (unless verify=False); None when there is none.
    A newest one that is incomplete or corrupt is refused (never skipped without a word), with the
    remedy in the message: move it aside to resume from the one before it."""
    dirs = checkpoint_dirs(root)
    if not dirs:
        return None
    try:
        return read_checkpoint(dirs[-1], verify)
    except CheckpointError as error:
        remedy = (f"move {dirs[-1].name} out of {root} to resume from {dirs[-2].name}" if len(dirs) > 1 else
                  f"it is the only one: move it out of {root} and train again with --force")
        raise CheckpointError(f"{error}; {remedy}") from None


def file_digest(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest} of a file, as state.json records it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def parameter_names(model, optimizer) -> list[list[str]]:
    """For each optimizer param group, the names (model.named_parameters()) of its parameters in order:
    what lets a checkpoint's optimizer state, stored by position, be read back by name."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [[names[id(param)] for param in group["params"]] for group in optimizer.param_groups]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
