"""Interleaved timing: every task once per round, round after round; medians of the measured rounds.

Pure Python (no torch), so every command that times something shares it: `attnres bench` and the
cost measurement of `attnres compare`. `round_ratios` and `ratio_spread` turn two tasks timed in the
same rounds into per-round ratios, their median and a confidence interval of it, the figures a cost
table prints.
"""

from __future__ import annotations

import math
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


def round_ratios(samples: Sequence[float], base_samples: Sequence[float]) -> list[float]:
    """samples[r] / base_samples[r] for every round r: two tasks timed in the same rounds of
    `run_interleaved`, so each ratio compares measurements made moments apart. ValueError when the
    lists differ in length (they did not come from the same rounds); rounds whose base is not
    positive are left out."""
    if len(samples) != len(base_samples):
        raise ValueError(f"round_ratios needs samples from the same rounds, got {len(samples)} and "
                         f"{len(base_samples)} samples")
    return [r for r in map(ratio, samples, base_samples) if r is not None]


def median_interval(values: Sequence[float], confidence: float = 0.9) -> tuple[float, float, float]:
    """(low, high, coverage): a distribution-free confidence interval of the median of `values`, the
    k-th smallest to the k-th largest value with the largest k whose coverage (the probability that
    the interval holds the true median, from the binomial distribution of values below it) is at least
    `confidence`; k = 1 (the whole range) when no k reaches it. Unlike the min-max range, it narrows
    as values are added. With 5 values it is the min-max range, with coverage 0.9375."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("median_interval needs at least one value")

    def coverage(k: int) -> float:  # 1 - 2 P(Binomial(n, 1/2) <= k - 1)
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def ratio_spread(ratios: Sequence[float], noise_threshold: float, confidence: float = 0.9) -> dict:
    """Median and spread of per-round ratios: {"ratio" (median), "low", "high" (`median_interval` at
    `confidence`), "coverage" (its actual coverage), "spread" ((high - low) / ratio, the interval's
    relative width), "noisy" (spread > noise_threshold)}; every value None for no ratios."""
    if not ratios:
        return {"ratio": None, "low": None, "high": None, "coverage": None, "spread": None, "noisy": None}
    middle = statistics.median(ratios)
    low, high, covered = median_interval(ratios, confidence)
    spread = (high - low) / middle
    return {"ratio": middle, "low": low, "high": high, "coverage": covered, "spread": spread,
            "noisy": spread > noise_threshold}
