"""Metrics to a JSONL file (one record per line) and, optionally, TensorBoard."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from attnres.common.atomic import naming_failures, write_atomic
from attnres.common.errors import InputError


class MetricsLogger:
    """Append records like {"step": 10, "loss": 3.2, ...} to `<run>/metrics.jsonl` and TensorBoard.

    On resume from step N, records after step N (written by the interrupted process after its last
    checkpoint) are dropped first, so the file reads as one uninterrupted run.
    """

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: int | None = None,
                 kept: list[dict] | None = None) -> None:
        """kept: on resume, the records to keep (`records_to_keep`, read and checked before the run
        wrote anything); read here when not given."""
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is None:
            self.path.write_text("")
        else:
            if kept is None:
                kept = records_to_keep(self.path, resume_step)
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # never a half-written history
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow to import

            self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=resume_step)

    def log(self, record: dict) -> None:
        """Write one record; numbers also go to TensorBoard under their key, and a list of numbers
        (a statistic by depth) as one scalar per index, `key/00`, `key/01`, ..."""
        with naming_failures(self.path), open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._writer is None:
            return
        for key, value in record.items():
            if key == "step":
                continue
            values = enumerate(value) if isinstance(value, list) else [(None, value)]
            for index, number in values:
                if isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number):
                    self._writer.add_scalar(key if index is None else f"{key}/{index:02d}", number, record["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """All records of `<run>/metrics.jsonl`, in order (a torn last line dropped with a warning)."""
    return read_records(Path(run_dir) / "metrics.jsonl")


def records_to_keep(path: Path, resume_step: int) -> list[dict]:
    """The records of `path` up to `resume_step`, those a run resumed from that step keeps (the
    interrupted process may have logged past its last checkpoint)."""
    records = read_records(path)
    for record in records:
        step = record.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int):
            raise InputError(f"{path}: a record's step is {step!r:.40}, not an integer; the trainer writes integer "
                             f"steps, so this file was changed by hand: fix that record or remove it")
    return [r for r in records if r.get("step", 0) <= resume_step]


def read_records(path: Path, warn=None) -> list[dict]:
    """The JSON objects of an append-only log, one per line. A torn or malformed last line (a process
    killed, or a disk filled, mid-write) is dropped with one warning naming the file and line; a
    malformed line before it raises InputError naming them, since that is no interrupted write."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    records = []
    for position, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
            problem = None if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"
        except json.JSONDecodeError as err:
            problem = f"not JSON ({err.msg})"
        if problem is None:
            records.append(record)
        elif position == len(numbered) - 1:
            (warn or _warn)(f"{path} line {number} is {problem}, the trace of an interrupted write: dropped")
        else:
            raise InputError(f"{path} line {number} is {problem}; only a last line can be torn by an interrupted "
                             f"write, so this file was changed by hand: fix or remove line {number}")
    return records


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)
