"""The fair-comparison protocol of `attnres compare` (a preset with a `protocol:` section).

1. Learning-rate search: every variant trains `grid_seeds` seeds at every rate of `lr_grid`
   (min_lr scaled with the rate, warm-up as the preset sets it).
2. Choice, from validation losses alone (`search_rates`), by `choice`:
   - "fit" (docs/explanation/protocol.md): a run has failed when its loss is not finite or above
     the failure threshold; over the stable rates, a quadratic in log2(rate) is fitted to the runs
     of five rates around the vertex of a first fit to all, and its vertex is the rate (`fit_rate`).
   - "argmin" (the 0.2 protocol): the rate with the lowest mean; a diverged rate is never chosen.
   A choice on the edge of the searched rates extends that variant's search by one grid step
   beyond it, up to `max_extensions` times; a choice still on the edge is reported as such.
3. Final runs: at its chosen rate each variant trains its final seeds and is reported on the data's
   test split, which nothing reads before the report. With `final_seed_start` at or above
   `grid_seeds` the final runs share no seed and no run with the search; with 0 (the 0.2 protocol)
   the search's seeds at the chosen rate are among them. `primary` names the residuals that train
   the preset's `seeds`; the others train `secondary_seeds`.

This module holds the protocol's settings and its pure decisions; `attnres.compare.tune` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from attnres.common.checks import check_int, is_number
from attnres.train.run_config import RunConfigError

PROTOCOL_KEYS = ("lr_grid", "grid_seeds", "max_extensions", "choice", "final_seed_start", "primary",
                 "secondary_seeds")
CHOICES = ("argmin", "fit")
FIT_WINDOW = 5  # rates in the fitted window (docs/explanation/protocol.md, "The fit")


@dataclass(frozen=True)
class Protocol:
    """lr_grid: the peak learning rates every variant is searched over (at least 2, distinct,
    positive); grid_seeds: seeds per rate in the search (seeds 0 … grid_seeds - 1); max_extensions:
    how many grid steps the search may extend beyond the grid for a variant whose choice is on its
    edge; choice: "argmin" or "fit"; final_seed_start: the first seed of the final runs ("fit" needs
    it at or above grid_seeds); primary: the residuals that train the preset's seeds (None: every
    variant); secondary_seeds: the final seeds of the others."""

    lr_grid: tuple[float, ...]
    grid_seeds: int = 2
    max_extensions: int = 2
    choice: str = "argmin"
    final_seed_start: int = 0
    primary: tuple[str, ...] | None = None
    secondary_seeds: int | None = None

    def __post_init__(self) -> None:
        grid = self.lr_grid
        if not isinstance(grid, (list, tuple)) or not all(is_number(r) and math.isfinite(r) and r > 0 for r in grid):
            raise RunConfigError(f"protocol.lr_grid must be a list of positive learning rates, got {grid!r}")
        if len(set(grid)) < 2:
            raise RunConfigError(f"protocol.lr_grid needs at least 2 distinct rates to choose from, got {list(grid)}")
        object.__setattr__(self, "lr_grid", tuple(sorted(float(r) for r in set(grid))))
        check_int(self.grid_seeds, "protocol.grid_seeds", error=RunConfigError)
        check_int(self.max_extensions, "protocol.max_extensions", minimum=0, error=RunConfigError)
        if self.choice not in CHOICES:
            raise RunConfigError(f"protocol.choice must be one of {list(CHOICES)}, got {self.choice!r}")
        check_int(self.final_seed_start, "protocol.final_seed_start", minimum=0, error=RunConfigError)
        if self.choice == "fit" and self.final_seed_start < self.grid_seeds:
            raise RunConfigError(f"protocol.final_seed_start must be at least grid_seeds ({self.grid_seeds}) with "
                                 f"choice 'fit': the final runs share no seed with the search, got "
                                 f"{self.final_seed_start}")
        if self.primary is not None:
            if not isinstance(self.primary, (list, tuple)) or not all(isinstance(p, str) for p in self.primary):
                raise RunConfigError(f"protocol.primary must be a list of residual names, got {self.primary!r}")
            object.__setattr__(self, "primary", tuple(self.primary))
            check_int(self.secondary_seeds, "protocol.secondary_seeds", error=RunConfigError)
        elif self.secondary_seeds is not None:
            raise RunConfigError("protocol.secondary_seeds needs protocol.primary (the residuals that are not "
                                 "secondary)")

    def is_primary(self, variant: dict) -> bool:
        """Whether a preset's variant is primary (every variant when `primary` is None)."""
        return self.primary is None or variant.get("residual") in self.primary

    def final_seeds(self, variant: dict, seeds: int) -> list[int]:
        """The final runs' seeds of `variant`, given the primary variants' count `seeds`."""
        count = seeds if self.is_primary(variant) else min(seeds, self.secondary_seeds)
        return list(range(self.final_seed_start, self.final_seed_start + count))

    @classmethod
    def from_dict(cls, values, where: str) -> "Protocol":
        """From a preset's `protocol:` mapping; errors name `where` and the allowed keys."""
        if not isinstance(values, dict):
            raise RunConfigError(f"{where}: 'protocol' must be a mapping with keys {', '.join(PROTOCOL_KEYS)}")
        unknown = sorted(set(values) - set(PROTOCOL_KEYS), key=str)
        if unknown:
            raise RunConfigError(f"{where}: unknown protocol key(s) {unknown}; allowed: {', '.join(PROTOCOL_KEYS)}")
        if "lr_grid" not in values:
            raise RunConfigError(f"{where}: protocol.lr_grid is required (at least 2 peak learning rates)")
        return cls(**values)

    def to_dict(self) -> dict:
        """The settings as plain data (lr_grid as a list)."""
        primary = None if self.primary is None else list(self.primary)
        return {**asdict(self), "lr_grid": list(self.lr_grid), "primary": primary}


@dataclass(frozen=True)
class RateSearch:
    """Where one variant's search stands. rates: every rate searched so far, ascending; missing: the
    rates whose search seeds are not all finished; mean_val: mean validation loss per finished rate
    (inf where a seed's loss is not finite); chosen: the rate with the lowest mean, None until nothing
    is missing; edge: "low" or "high" when the chosen rate is the lowest or highest searched and the
    search may not extend further, else None; extended: the rates added beyond the grid; fit: the
    fitted curve ("fit" choice, `RateFit`), else None."""

    rates: tuple[float, ...]
    missing: tuple[float, ...]
    mean_val: dict[float, float]
    chosen: float | None
    edge: str | None
    extended: tuple[float, ...]
    fit: "RateFit | None" = None


@dataclass(frozen=True)
class RateFit:
    """A quadratic in log2(rate) fitted to one variant's search runs (docs/explanation/protocol.md).

    rate: the chosen rate (the vertex, or the window's edge where there is no vertex inside it);
    low, high: the vertex's 95 % interval (delta method), None without a vertex or residual degrees
    of freedom; window: the fitted rates; coefficients: (a, b, c) of a + b x + c x^2; vertex_inside:
    whether the rate is the vertex; highest_stable: the highest rate below which no run failed (None
    when the lowest failed); failed: failed runs per rate."""

    rate: float
    low: float | None
    high: float | None
    window: tuple[float, ...]
    coefficients: tuple[float, float, float] | None
    vertex_inside: bool
    highest_stable: float | None
    failed: dict[float, int]

    def to_dict(self) -> dict:
        """Plain data for results.json (rates as lists, failures keyed by the rate's text)."""
        return {**asdict(self), "window": list(self.window), "failed": {f"{r:g}": n for r, n in self.failed.items()},
                "coefficients": None if self.coefficients is None else list(self.coefficients)}


def mean_loss(losses: list[float]) -> float:
    """The mean of a rate's seed losses; inf when any is not finite (a rate that diverged is never best)."""
    values = [float(x) for x in losses]
    return sum(values) / len(values) if values and all(math.isfinite(x) for x in values) else math.inf


def _rounded(rate: float) -> float:
    return float(f"{rate:.3g}")  # 2.4e-2, not 0.024000000000000004: the rate names a run folder


def failed(loss: float, threshold: float) -> bool:
    """Whether a run failed: its loss is not finite or above `threshold`."""
    return not math.isfinite(loss) or loss > threshold


def _quadratic(rates: list[float], losses: dict[float, list[float]]):
    """x, y, the design matrix and the least-squares (a, b, c) of y = a + b x + c x^2 over every run."""
    x = np.array([math.log2(r) for r in rates for _ in losses[r]])
    y = np.array([v for r in rates for v in losses[r]], dtype=float)
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    return x, y, design, np.linalg.lstsq(design, y, rcond=None)[0]


def _centre(stable: list[float], losses: dict[float, list[float]]) -> float:
    """Where the window goes, in log2(rate): the vertex of the quadratic over every stable rate, kept
    within them; without one, the end with the lower mean loss. Not the argmin of noisy means."""
    *_, (_, b, c) = _quadratic(stable, losses)
    lo, hi = math.log2(stable[0]), math.log2(stable[-1])
    if c > 0:
        return min(max(-b / (2 * c), lo), hi)
    return hi if mean_loss(losses[stable[-1]]) < mean_loss(losses[stable[0]]) else lo


def fit_rate(losses: dict[float, list[float]], threshold: float = math.inf) -> RateFit:
    """The protocol's fitted choice from every searched rate's validation losses (`losses`, ascending
    rates or not): the stable rates are those below the first rate where a run failed; a quadratic
    in x = log2(rate) is fitted by least squares to the runs of the FIT_WINDOW consecutive stable
    rates nearest the vertex of the same fit over every stable rate (`_centre`); its vertex, inside the window and opening upwards, is the rate,
    else the window's edge nearer to where the loss falls."""
    rates = sorted(losses)
    failures = {r: sum(failed(x, threshold) for x in losses[r]) for r in rates}
    stable = []
    for rate in rates:
        if failures[rate]:
            break
        stable.append(rate)
    highest = stable[-1] if stable else None
    if len(stable) < 3:  # no curve through fewer than three rates: the best stable rate, or the lowest
        pick = min(stable, key=lambda r: (mean_loss(losses[r]), r)) if stable else rates[0]
        return RateFit(pick, None, None, tuple(stable), None, False, highest, failures)
    centre = _centre(stable, losses)
    window = sorted(sorted(stable, key=lambda r: abs(math.log2(r) - centre))[:FIT_WINDOW])
    x, y, design, coef = _quadratic(window, losses)
    a, b, c = (float(v) for v in coef)
    lo, hi = math.log2(window[0]), math.log2(window[-1])
    vertex = -b / (2 * c) if c > 0 else None
    if vertex is None or not lo <= vertex <= hi:
        falls_high = vertex > hi if vertex is not None else mean_loss(losses[window[-1]]) < mean_loss(losses[window[0]])
        pick = window[-1] if falls_high else window[0]
        return RateFit(pick, None, None, tuple(window), (a, b, c), False, highest, failures)
    low = high = None
    dof = len(y) - 3
    if dof > 0:
        from scipy.stats import t  # as intervals.py: scipy only where an interval is drawn

        residual = y - design @ coef
        covariance = float(residual @ residual) / dof * np.linalg.inv(design.T @ design)
        gradient = np.array([0.0, -1 / (2 * c), b / (2 * c * c)])
        half = float(t.ppf(0.975, dof)) * math.sqrt(max(float(gradient @ covariance @ gradient), 0.0))
        low, high = 2 ** (vertex - half), 2 ** (vertex + half)
    return RateFit(_rounded(2 ** vertex), low, high, tuple(window), (a, b, c), True, highest, failures)


def search_rates(protocol: Protocol, val_losses: Callable[[float], list[float] | None],
                 threshold: float = math.inf) -> RateSearch:
    """One variant's learning-rate search, from its validation losses alone.

    val_losses(rate): the final validation losses of the search seeds at `rate`, or None while any
    is unfinished. threshold: the loss above which a run has failed ("fit" choice). The test split is
    not an input: nothing here can depend on it.
    """
    rates = list(protocol.lr_grid)
    extended: list[float] = []
    while True:
        missing = tuple(r for r in rates if val_losses(r) is None)
        if missing:
            return RateSearch(tuple(rates), missing, {}, None, None, tuple(extended))
        means = {r: mean_loss(val_losses(r)) for r in rates}
        fit = None
        if protocol.choice == "fit":
            fit = fit_rate({r: list(val_losses(r)) for r in rates}, threshold)
            best = fit.rate
            on_edge = not fit.vertex_inside and best in (rates[0], rates[-1])
            edge = None if not on_edge else "high" if best == rates[-1] else "low"
        else:
            best = min(rates, key=lambda r: (means[r], r))  # ties and all-diverged: the lowest rate
            edge = "high" if best == rates[-1] else "low" if best == rates[0] else None
        if edge is None or len(extended) >= protocol.max_extensions:
            return RateSearch(tuple(rates), (), means, best, edge, tuple(extended), fit)
        if edge == "high":
            rates.append(_rounded(best * rates[-1] / rates[-2]))
            extended.append(rates[-1])
        else:
            rates.insert(0, _rounded(best * rates[0] / rates[1]))
            extended.append(rates[0])


def unigram_entropy(tokens, vocab_size: int) -> float:
    """The entropy in nats of the token frequencies of `tokens` (1-D ids below vocab_size): the loss
    of a model that predicts frequencies alone, the protocol's failure threshold."""
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def rate_label(rate: float) -> str:
    """A rate as a run folder names it: "lr3.00e-03"."""
    return f"lr{rate:.2e}"
