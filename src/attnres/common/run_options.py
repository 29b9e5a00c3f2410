"""The options every job that writes a report shares: its output folder, its seeds and its shard,
checked before anything is trained or written (`attnres compare`, `scaling`, `bench`, `analyze`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from attnres.common.checks import check_int
from attnres.common.errors import InputError
from attnres.common.user_paths import broken_link, unexpanded_home


RUN_FOLDERS = ("checkpoints",)  # what a training run writes inside its out_dir that would break only at its first save


def check_out_dir(out: str | Path, what: str = "--out", *, folders: tuple[str, ...] | None = None,
                  error: type[Exception] = InputError) -> Path:
    """`error` (InputError) naming `what` and the path unless `out` is a writable folder or can be
    made one (its nearest existing parent is a folder in which a folder can be made): refused now,
    not after the work is done, and nothing is left behind. A symlink is followed; a dangling one or
    a loop is refused, so is an empty path and one beginning with a `~` nothing expanded (a shell
    leaves `--out=~/x` as written: `attnres.common.user_paths.user_path` expands it). `folders`:
    names inside `out` that the job writes into, each refused when it is a file, a dangling symlink
    or a loop (default: `RUN_FOLDERS` for a training run's "out_dir", none otherwise). Returns `out`
    as a Path."""
    if isinstance(out, str) and not out.strip():
        raise error(f"{what} is empty; give a folder path (an empty one would mean the working directory: "
                    f"write . for it)")
    out = Path(out)
    if unexpanded_home(out):
        raise error(f"{what} {out} begins with a '~' that was not expanded (a shell leaves {what}=~/x as "
                    f"written); write {what} ~/x as two words, or the full path")
    broken = broken_link(out)
    if broken is not None:
        raise error(f"{what} {out} is {broken}; give a folder path")
    if out.exists() and not out.is_dir():
        raise error(f"{what} {out} is a file, not a folder; give a folder path (it is created if missing)")
    target = out
    while not target.exists():  # the first existing folder up the path is where it would be created
        broken = broken_link(target)
        if broken is not None:
            raise error(f"{what} {out} cannot be created: {target} is {broken}")
        target = target.parent
    if not target.is_dir():
        raise error(f"{what} {out} cannot be created: {target} is a file, not a folder")
    if not os.access(target, os.W_OK | os.X_OK):
        where = "" if target == out else f" (it would be created in {target}, which is not writable)"
        raise error(f"{what} {out} is not writable by this user{where}; give a folder you can write to")
    if target != out:
        _check_can_create(out, target, what, error)
    for name in RUN_FOLDERS if folders is None and what == "out_dir" else folders or ():
        _check_inner_folder(out, name, what, error)
    return out


def _check_can_create(out: Path, target: Path, what: str, error: type[Exception]) -> None:
    """Make and remove a folder in `target`, where `out` would be created: some file systems refuse
    one whatever the permissions say (/proc, /sys, a read-only mount seen by root)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnres-probe.", dir=target))
    except OSError as failure:
        raise error(f"{what} {out} cannot be created: {target} takes no new folder ({failure.strerror}); give a "
                    f"folder on a writable disk") from None


def _check_inner_folder(out: Path, name: str, what: str, error: type[Exception]) -> None:
    """`out / name`, a folder the job writes into, must be missing or a writable folder."""
    inner = out / name
    broken = broken_link(inner)
    if broken is not None:
        raise error(f"{what} {out}: its {name} is {broken}; remove it or make it a folder, or choose another {what}")
    if inner.exists() and not inner.is_dir():
        raise error(f"{what} {out}: its {name} is a file, not a folder; remove it, or choose another {what}")
    if inner.is_dir() and not os.access(inner, os.W_OK | os.X_OK):
        raise error(f"{what} {out}: its {name} folder {inner} is not writable by this user; give a folder you can "
                    f"write to")


def check_run_options(out: str | Path, seeds: int | None) -> None:
    """A sweep's --out and --seeds (None: the preset's; 0 is refused, not read as "the preset's")."""
    check_out_dir(out)
    if seeds is not None:
        check_int(seeds, "--seeds")


def parse_shard(text: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N), the runs I, I+N, ... of N processes; None -> (0, 1), every run."""
    if text is None:
        return (0, 1)
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise InputError(f"--shard must be I/N with 0 <= I < N, e.g. 0/2; got {text!r}")
    return index, count
