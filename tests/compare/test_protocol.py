"""The protocol's decisions: a rate per variant from validation losses alone, the search extended where
the best rate is on the grid's edge, a diverged rate never chosen."""

import math

import pytest

from attnres.compare.protocol import Protocol, mean_loss, rate_label, search_rates
from attnres.train import RunConfigError

GRID = Protocol(lr_grid=(1e-3, 2e-3, 4e-3, 8e-3), grid_seeds=2, max_extensions=2)


def losses_from(curve: dict[float, float]):
    """val_losses for search_rates: two seeds at each rate of `curve`, None elsewhere (not yet trained)."""
    return lambda rate: None if rate not in curve else [curve[rate] - 0.01, curve[rate] + 0.01]


def test_the_rate_with_the_lowest_mean_validation_loss_is_chosen():
    search = search_rates(GRID, losses_from({1e-3: 5.0, 2e-3: 4.8, 4e-3: 4.7, 8e-3: 4.9}))
    assert search.chosen == 4e-3 and search.edge is None and search.extended == () and search.missing == ()
    assert search.mean_val[4e-3] == pytest.approx(4.7)


def test_nothing_is_chosen_while_a_seed_is_missing():
    search = search_rates(GRID, losses_from({1e-3: 5.0, 2e-3: 4.8, 4e-3: 4.7}))
    assert search.chosen is None and search.missing == (8e-3,)


def test_a_best_rate_on_the_high_edge_extends_the_search_by_one_grid_step():
    curve = {1e-3: 5.0, 2e-3: 4.9, 4e-3: 4.8, 8e-3: 4.7}
    first = search_rates(GRID, losses_from(curve))
    assert first.missing == (1.6e-2,) and first.extended == (1.6e-2,) and first.chosen is None
    curve[1.6e-2] = 4.75  # worse than 8e-3: the choice is now inside the searched rates
    second = search_rates(GRID, losses_from(curve))
    assert second.chosen == 8e-3 and second.edge is None and second.rates[-1] == 1.6e-2


def test_a_best_rate_on_the_low_edge_extends_downwards_and_the_cap_is_reported():
    curve = {5e-4: 4.6, 2.5e-4: 4.5, 1e-3: 4.7, 2e-3: 4.8, 4e-3: 4.9, 8e-3: 5.0}
    search = search_rates(GRID, losses_from(curve))
    assert search.extended == (5e-4, 2.5e-4) and search.chosen == 2.5e-4 and search.edge == "low"
    assert search.rates == (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3)


def test_a_rate_where_any_seed_diverged_is_never_chosen():
    curve = lambda rate: {1e-3: [5.0, 5.0], 2e-3: [4.8, 4.8], 4e-3: [4.0, math.nan], 8e-3: [math.inf, 6.0]}[rate]
    search = search_rates(Protocol(lr_grid=(1e-3, 2e-3, 4e-3, 8e-3), max_extensions=0), curve)
    assert search.chosen == 2e-3 and search.mean_val[4e-3] == math.inf and mean_loss([1.0, math.nan]) == math.inf


def test_the_choice_reads_validation_losses_only():
    # search_rates' one input is the validation losses; the same losses give the same choice whatever
    # the test split holds (tests/compare/test_tune.py checks it end to end).
    seen = []
    search_rates(GRID, lambda rate: seen.append(rate) or [4.0, 4.0])
    assert set(seen) <= set(GRID.lr_grid) | {5e-4, 2.5e-4}


@pytest.mark.parametrize("grid, message", [
    ([3e-3], "at least 2 distinct rates"), ([3e-3, 3e-3], "at least 2 distinct rates"),
    ([3e-3, -1e-3], "positive learning rates"), ("3e-3", "positive learning rates"),
    ([3e-3, float("nan")], "positive learning rates")])
def test_a_grid_of_fewer_than_two_rates_is_refused(grid, message):
    with pytest.raises(RunConfigError, match=message):
        Protocol(lr_grid=grid)


def test_settings_are_checked_by_name():
    with pytest.raises(RunConfigError, match="protocol.grid_seeds"):
        Protocol(lr_grid=(1e-3, 2e-3), grid_seeds=0)
    with pytest.raises(RunConfigError, match="unknown protocol key.*lr_grid, grid_seeds, max_extensions"):
        Protocol.from_dict({"lr_grid": [1e-3, 2e-3], "seeds": 3}, "preset x")
    assert Protocol(lr_grid=[4e-3, 1e-3]).lr_grid == (1e-3, 4e-3) and rate_label(3e-3) == "lr3.00e-03"
