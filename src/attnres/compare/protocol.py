"""The fair-comparison protocol of `attnres compare` (a preset with a `protocol:` section).

1. Learning-rate search: every variant trains `grid_seeds` seeds at every rate of `lr_grid`
   (min_lr scaled with the rate, warm-up as the preset sets it).
2. Choice: each variant's rate is the one with the lowest mean validation loss; a rate at which
   any seed's loss is not finite is never chosen. A choice on the edge of the searched rates
   extends that variant's search by one grid step beyond it, up to `max_extensions` times; a
   choice still on the edge is reported as such.
3. Final runs: at its chosen rate each variant trains the preset's `seeds` seeds (the search's seeds
   at that rate are among them) and is reported on the data's test split, which nothing reads
   before the report: the choice is a function of validation losses alone (`search_rates`).

This module holds the protocol's settings and its pure decisions; `attnres.compare.tune` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from attnres.common.checks import check_int, is_number
from attnres.train.run_config import RunConfigError

PROTOCOL_KEYS = ("lr_grid", "grid_seeds", "max_extensions")


@dataclass(frozen=True)
class Protocol:
    """lr_grid: the peak learning rates every variant is searched over (at least 2, distinct,
    positive); grid_seeds: seeds per rate in the search; max_extensions: how many grid steps the
    search may extend beyond the grid for a variant whose best rate is on its edge."""

    lr_grid: tuple[float, ...]
    grid_seeds: int = 2
    max_extensions: int = 2

    def __post_init__(self) -> None:
        grid = self.lr_grid
        if not isinstance(grid, (list, tuple)) or not all(is_number(r) and math.isfinite(r) and r > 0 for r in grid):
            raise RunConfigError(f"protocol.lr_grid must be a list of positive learning rates, got {grid!r}")
        if len(set(grid)) < 2:
            raise RunConfigError(f"protocol.lr_grid needs at least 2 distinct rates to choose from, got {list(grid)}")
        object.__setattr__(self, "lr_grid", tuple(sorted(float(r) for r in set(grid))))
        check_int(self.grid_seeds, "protocol.grid_seeds", error=RunConfigError)
        check_int(self.max_extensions, "protocol.max_extensions", minimum=0, error=RunConfigError)

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
        return {**asdict(self), "lr_grid": list(self.lr_grid)}


@dataclass(frozen=True)
class RateSearch:
    """Where one variant's search stands. rates: every rate searched so far, ascending; missing: the
    rates whose search seeds are not all finished; mean_val: mean validation loss per finished rate
    (inf where a seed's loss is not finite); chosen: the rate with the lowest mean, None until nothing
    is missing; edge: "low" or "high" when the chosen rate is the lowest or highest searched and the
    search may not extend further, else None; extended: the rates added beyond the grid."""

    rates: tuple[float, ...]
    missing: tuple[float, ...]
    mean_val: dict[float, float]
    chosen: float | None
    edge: str | None
    extended: tuple[float, ...]


def mean_loss(losses: list[float]) -> float:
    """The mean of a rate's seed losses; inf when any is not finite (a rate that diverged is never best)."""
    values = [float(x) for x in losses]
    return sum(values) / len(values) if values and all(math.isfinite(x) for x in values) else math.inf


def _rounded(rate: float) -> float:
    return float(f"{rate:.3g}")  # 2.4e-2, not 0.024000000000000004: the rate names a run folder


def search_rates(protocol: Protocol, val_losses: Callable[[float], list[float] | None]) -> RateSearch:
    """One variant's learning-rate search, from its validation losses alone.

    val_losses(rate): the final validation losses of the search seeds at `rate`, or None while any
    is unfinished. The test split is not an input: nothing here can depend on it.
    """
    rates = list(protocol.lr_grid)
    extended: list[float] = []
    while True:
        missing = tuple(r for r in rates if val_losses(r) is None)
        if missing:
            return RateSearch(tuple(rates), missing, {}, None, None, tuple(extended))
        means = {r: mean_loss(val_losses(r)) for r in rates}
        best = min(rates, key=lambda r: (means[r], r))  # ties and all-diverged: the lowest rate
        edge = "high" if best == rates[-1] else "low" if best == rates[0] else None
        if edge is None or len(extended) >= protocol.max_extensions:
            return RateSearch(tuple(rates), (), means, best, edge, tuple(extended))
        if edge == "high":
            rates.append(_rounded(best * rates[-1] / rates[-2]))
            extended.append(rates[-1])
        else:
            rates.insert(0, _rounded(best * rates[0] / rates[1]))
            extended.append(rates[0])


def rate_label(rate: float) -> str:
    """A rate as a run folder names it: "lr3.00e-03"."""
    return f"lr{rate:.2e}"
