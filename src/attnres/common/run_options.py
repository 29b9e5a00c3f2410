"""The options every job that writes a report shares: its output folder, its seeds and its shard,
checked before anything is trained or written (`attnres compare`, `scaling`, `bench`, `analyze`)."""

from __future__ import annotations

import os
from pathlib import Path

from attnres.common.checks import check_int
from attnres.common.errors import InputError


def check_out_dir(out: str | Path, what: str = "--out") -> None:
    """InputError naming `what` and the path unless `out` is a writable folder or can be made one
    (its nearest existing parent is a writable folder): refused now, not after the work is done, and
    nothing is created. A symlink is followed; a dangling one is refused."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise InputError(f"{what} {out} is a symlink to {os.readlink(out)}, which does not exist; give a folder path")
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {out} is a file, not a folder; give a folder path (it is created if missing)")
    target = out
    while not target.exists():  # the first existing folder up the path is where it would be created
        if target.is_symlink():
            raise InputError(f"{what} {out} cannot be created: {target} is a symlink to {os.readlink(target)}, "
                             f"which does not exist")
        target = target.parent
    if not target.is_dir():
        raise InputError(f"{what} {out} cannot be created: {target} is a file, not a folder")
    if not os.access(target, os.W_OK | os.X_OK):
        where = "" if target == out else f" (it would be created in {target}, which is not writable)"
        raise InputError(f"{what} {out} is not writable by this user{where}; give a folder you can write to")


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
