"""Metrics to a JSONL file (one record per line) and, optionally, TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path

from attnres.common.atomic import write_atomic


class MetricsLogger:
    """Append records like {"step": 10, "loss": 3.2, ...} to `<run>/metrics.jsonl` and TensorBoard.

    On resume from step N, records after step N (written by the interrupted process after its last
    checkpoint) are dropped first, so the file reads as one uninterrupted run.
    """

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [line for line in _read_lines(self.path) if json.loads(line).get("step", 0) <= resume_step]
            write_atomic(self.path, "".join(line + "\n" for line in kept))  # never a half-written history
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow to import

            self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=resume_step)

    def log(self, record: dict) -> None:
        """Write one record; numbers also go to TensorBoard under their key, and a list of numbers
        (a statistic by depth) as one scalar per index, `key/00`, `key/01`, ..."""
        with open(self.path, "a") as handle:
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
    """All records of `<run>/metrics.jsonl`, in order."""
    return [json.loads(line) for line in _read_lines(Path(run_dir) / "metrics.jsonl")]


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line for line in path.read_text().splitlines() if line.strip()]
