"""Interleaved timing: every task once per round, round after round; medians of the measured rounds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    """One timed operation.

    `run()` is timed; `setup()` (optional, untimed) runs right before it in every round. The elapsed
    seconds are divided by `units` (e.g. the number of tokens a decode task generates), so samples
    are seconds per unit.
    """

    name: str
    run: Callable[[], object]
    setup: Callable[[], object] | None = None
    units: int = 1


@dataclass
class Timing:
    """Measured samples of one task (seconds per unit, in round order, warm-up rounds excluded)."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median of the samples, in seconds per unit."""
        return statistics.median(self.samples)

    def to_dict(self) -> dict:
        """{'median_s', 'samples_s'} for JSON."""
        return {"median_s": self.median, "samples_s": list(self.samples)}


def run_interleaved(tasks: Sequence[Task], repeats: int, warmup: int, clock: Callable[[], float] = time.perf_counter,
                    sync: Callable[[], object] | None = None, log: Callable[[str], object] | None = None,
                    label: str = "") -> dict[str, Timing]:
    """Run `tasks` round-robin for warmup + repeats rounds; return each task's Timing by name.

    Round r runs tasks[0], tasks[1], ... in order, so a slow drift of the machine (thermal, other
    jobs) hits every task alike. The first `warmup` rounds are discarded. `sync` (e.g.
    torch.cuda.synchronize) is called before starting and before stopping the clock.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"run_interleaved needs repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be unique, got {names}")
    timings = {name: Timing() for name in names}
    total = warmup + repeats
    for r in range(total):
        if log is not None:
            phase = "warm-up" if r < warmup else "measured"
            log(f"{label}round {r + 1}/{total} ({phase})")
        for task in tasks:
            if task.setup is not None:
                task.setup()
            if sync is not None:
                sync()
            start = clock()
            task.run()
            if sync is not None:
                sync()
            elapsed = clock() - start
            if r >= warmup:
                timings[task.name].samples.append(elapsed / task.units)
    return timings


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; None when either is missing or the base is not positive."""
    if value is None or base is None or base <= 0:
        return None
    return value / base
