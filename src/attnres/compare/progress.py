"""Progress of a whole `attnres compare`: runs done / total, the current run's steps, and an ETA.

A comparison trains run after run for minutes each, with the per-run bar off (presets set
`train.progress: false`), so this is what tells a reader it is alive and when it will end. On a
terminal it is one tqdm bar over every step this process trains, redrawn in place; log lines are
written above it. Anywhere else (a log file, CI) a bar redrawn in place would add a line per update,
so it writes plain lines instead: one when a run starts and ends, and one every quarter of a run.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable

from tqdm.auto import tqdm

LINES_PER_RUN = 4  # without a terminal: a line every quarter of a run, besides its start and end
FALLBACK_SIZE = (100, 24)  # columns, rows for a terminal that reports 0 x 0 (tqdm hides bars below row 0)


class CompareProgress:
    """The progress display of one comparison (one process; a shard counts its own runs).

    total_runs: the runs this process accounts for (finished earlier + to train here); done_runs:
    how many of them are finished already; steps: optimizer steps still to train here. interactive:
    a tqdm bar (True) or plain lines through `log` (False); None decides by whether `stream`
    (default sys.stderr, where tqdm draws) is a terminal. clock: seconds, for the ETA of plain lines.
    command: the name its lines and bar start with ("compare", "scaling").
    The display starts at construction, so it is visible before the first run has set up.
    """

    def __init__(self, total_runs: int, done_runs: int, steps: int, log: Callable[[str], object] = print,
                 interactive: bool | None = None, stream=None, clock: Callable[[], float] = time.monotonic,
                 command: str = "compare") -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.total_runs, self.done_runs, self.total_steps = total_runs, done_runs, steps
        self.log, self.clock = log, clock
        self.steps_done, self.started = 0, clock()
        self.label, self.run_steps, self.first_step, self.next_line = "", 0, None, 0
        self.bar = None
        if self.interactive:
            unsized = _reported_size(self.stream) == (0, 0)  # a bare pty: tqdm would draw nothing
            self.bar = tqdm(total=steps, unit="step", file=self.stream, desc=self._runs(), dynamic_ncols=not unsized,
                            **({"ncols": FALLBACK_SIZE[0], "nrows": FALLBACK_SIZE[1]} if unsized else {}))
        else:
            self.log(f"{self.command}: {total_runs} run(s), {done_runs} finished earlier; {steps} step(s) to train")

    def _runs(self) -> str:
        return f"{self.command} {self.done_runs}/{self.total_runs} runs"

    def note(self, text: str) -> None:
        """A log line (a run's result, a resumption) that does not break the bar."""
        if self.bar is not None:
            with tqdm.external_write_mode(file=self.stream):
                self.log(text)
        else:
            self.log(text)

    def start_run(self, label: str, steps: int, what: str = "training") -> None:
        """A run of `steps` optimizer steps starts; `what` says how ("training", "resuming": a resumed
        run's earlier steps leave the total when its first step is reported, see `step`)."""
        self.label, self.run_steps, self.first_step = label, steps, None
        self.next_line = 0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{label}: {what}, setting up", refresh=True)
        else:
            self.log(f"[{self.done_runs + 1}/{self.total_runs}] {label}: {what} {steps} steps{self._eta()}")

    def step(self, record: dict) -> None:
        """The trainer finished step record["step"] of the current run (the trainer's `on_step`)."""
        step = int(record["step"])
        if self.first_step is None:  # a resumed run starts past 0: those steps were trained earlier
            self.first_step = step
            skipped = step - 1
            self.total_steps -= skipped
            self.next_line = step - 1 + self._line_every()
            if self.bar is not None and skipped:
                self.bar.total = self.total_steps
        self.steps_done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.label}: step {step}/{self.run_steps}", refresh=False)
            self.bar.update(1)
        elif step >= self.next_line and step < self.run_steps:
            self.next_line = step + self._line_every()
            self.log(f"[{self.done_runs + 1}/{self.total_runs}] {self.label}: step {step}/{self.run_steps}"
                     f"{self._eta()}")

    def _line_every(self) -> int:
        return max(1, -(-self.run_steps // LINES_PER_RUN))

    def finish_run(self, text: str) -> None:
        """The current run ended; `text` (its result) is logged."""
        self.done_runs += 1
        if self.bar is not None:
            self.bar.set_description_str(self._runs(), refresh=False)
        self.note(f"[{self.done_runs}/{self.total_runs}] {text}")

    def phase(self, text: str) -> None:
        """What runs after training (the cost measurement, the report), shown where the run was."""
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)
        else:
            self.log(f"{self.command}: {text}")

    def _eta(self) -> str:
        """', 1:02 elapsed, ETA 3:10' from the steps trained so far; '' before the first step."""
        if not self.steps_done:
            return ""
        elapsed = self.clock() - self.started
        remaining = max(0, self.total_steps - self.steps_done) * elapsed / self.steps_done
        return f", {_minutes(elapsed)} elapsed, ETA {_minutes(remaining)}"

    def close(self) -> None:
        """Remove the bar (lines need no closing)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _reported_size(stream) -> tuple[int, int] | None:
    """(columns, rows) the terminal behind `stream` reports ((0, 0) for a pty nobody sized), None if unknown."""
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
