"""Seed statistics: mean, sample std, the Student-t 95 % half-width (scipy quantiles), median ratio."""

import math
import statistics

import pytest

from attnres.analysis.intervals import ci95_halfwidth, mean, sample_std, t_quantile_975

# The hand-written table these replace: t_{0.975, df} for df = 1 .. 10, to 3 decimals.
OLD_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def test_ci95_uses_student_t_and_needs_two_seeds():
    # Moved from tests/compare/test_report.py. The quantile now comes from scipy: the three-seed
    # check compares t to the 3 decimals it is given with, and 21 seeds use t_{0.975, 20} = 2.086
    # where the old table fell back to 1.96.
    assert ci95_halfwidth([1.0]) is None
    # three seeds: mean 2, sample std 1, t_{0.975, 2} = 4.303
    assert ci95_halfwidth([1.0, 2.0, 3.0]) == pytest.approx(4.303 / math.sqrt(3), abs=5e-4 / math.sqrt(3))
    assert ci95_halfwidth([1.0] * 20 + [2.0]) == pytest.approx(
        2.086 * statistics.stdev([1.0] * 20 + [2.0]) / math.sqrt(21), abs=5e-4)


def test_t_quantiles_match_the_old_table_and_go_beyond_it():
    for df, expected in enumerate(OLD_T_975, start=1):
        assert round(t_quantile_975(df), 3) == expected
    assert round(t_quantile_975(11), 3) == 2.201
    assert t_quantile_975(10_000) == pytest.approx(1.960, abs=1e-3)  # the normal limit


def test_twelve_seeds_use_t_with_eleven_degrees_of_freedom_not_1_96():
    values = [2.0, 2.1, 1.9, 2.3, 2.2, 1.8, 2.05, 1.95, 2.15, 2.25, 1.85, 2.0]
    std_error = statistics.stdev(values) / math.sqrt(12)
    half = ci95_halfwidth(values)
    assert half == pytest.approx(2.201 * std_error, abs=5e-4 * std_error)
    assert half > 1.96 * std_error * 1.1  # the old fallback was 11 % too narrow here
    assert ci95_halfwidth([1.0, 2.0, 3.0]) == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)


def test_std_and_interval_are_nan_for_a_diverged_run():
    assert sample_std([1.0]) == 0.0
    assert sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2))
    assert math.isnan(sample_std([1.0, math.inf]))
    assert math.isnan(ci95_halfwidth([1.0, math.nan]))


def test_mean():
    assert mean([]) is None and mean([1.0, 2.0, 6.0]) == 3.0
