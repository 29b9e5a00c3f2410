"""The options every job that writes a report shares: its output folder, its seeds and its shard,
checked before anything is trained or written (`attnres compare`, `scaling`, `bench`, `analyze`)."""

from __future__ import annotations

from pathlib import Path

from attnres.common.checks import check_int
from attnres.common.errors import InputError


def check_out_dir(out: str | Path) -> None:
    """InputError for an --out that exists and is not a folder: refused now, not after the work is done."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder; give a folder path (it is created if missing)")


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
