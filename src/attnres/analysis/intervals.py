"""Statistics over seeds: mean, sample standard deviation, Student-t 95 % interval."""

from __future__ import annotations

import math
import statistics


def mean(values: list[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


def sample_std(values: list[float]) -> float:
    """Sample standard deviation (n - 1); 0.0 for one value; NaN if a value is not finite (a diverged run)."""
    if not all(math.isfinite(v) for v in values):
        return math.nan  # statistics.stdev raises on inf/nan
    return statistics.stdev(values) if len(values) > 1 else 0.0


def t_quantile_975(degrees_of_freedom: int) -> float:
    """The two-sided 95 % Student-t quantile t_{0.975, df}, e.g. 12.706 for df = 1, 2.201 for df = 11."""
    from scipy.stats import t  # scipy.stats takes about a second to import; only intervals need it

    return float(t.ppf(0.975, degrees_of_freedom))


def ci95_halfwidth(values: list[float]) -> float | None:
    """Half-width of the 95 % confidence interval of the mean (Student t with n - 1 degrees of freedom,
    sample std); None for one value (no interval), NaN if a value is not finite."""
    n = len(values)
    if n < 2:
        return None
    return t_quantile_975(n - 1) * sample_std(values) / math.sqrt(n)
