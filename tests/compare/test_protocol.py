"""The protocol's decisions: a rate per variant from validation losses alone, the search extended where
the best rate is on the grid's edge, a diverged rate never chosen."""

import math

import pytest

from attnres.compare.protocol import Protocol, fit_rate, mean_loss, rate_label, search_rates, unigram_entropy
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


FIT = Protocol(lr_grid=tuple(3e-3 * 2 ** (k / 2) for k in range(-1, 5)), grid_seeds=2, max_extensions=2,
               choice="fit", final_seed_start=1000)


def parabola(vertex: float, curvature: float = 0.1, floor: float = 4.0, noise: float = 0.0):
    """val_losses for search_rates: two seeds on floor + curvature (log2 rate - log2 vertex)^2, +- noise."""
    def losses(rate):
        y = floor + curvature * (math.log2(rate) - math.log2(vertex)) ** 2
        return [y - noise, y + noise]
    return losses


@pytest.mark.parametrize("vertex", [2.6e-3, 5e-3, 7.1e-3, 1.0e-2])
def test_the_fitted_rate_is_the_vertex_of_the_quadratic_in_log_rate_not_a_grid_point(vertex):
    search = search_rates(FIT, parabola(vertex, noise=0.01))
    assert search.fit.vertex_inside and search.chosen == pytest.approx(vertex, rel=1e-2)
    assert search.fit.low < search.chosen < search.fit.high and search.edge is None


def test_the_fit_uses_five_rates_around_a_first_fits_vertex():
    search = search_rates(FIT, parabola(3e-3))
    assert len(search.fit.window) == 5 and search.fit.window[0] == min(FIT.lr_grid)


def test_noise_moves_the_fitted_rate_less_than_it_moves_the_argmin():
    # The same curve, its optimum at 6e-3, searched both ways: one lucky neighbour wins the argmin, and
    # moves the fitted vertex by a fraction of the half-octave.
    def noisy(rate):
        y = 4.0 + 0.05 * (math.log2(rate) - math.log2(6e-3)) ** 2
        bump = -0.02 if rate == FIT.lr_grid[4] else 0.0
        return [y + bump - 0.01, y + bump + 0.01]
    argmin = search_rates(Protocol(lr_grid=FIT.lr_grid, max_extensions=0), noisy)
    fitted = search_rates(Protocol(**{**FIT.to_dict(), "max_extensions": 0}), noisy)
    assert argmin.chosen == FIT.lr_grid[4] and 6e-3 < fitted.chosen < 7.2e-3


def test_a_vertex_beyond_the_grid_extends_the_search_by_half_octaves():
    curve, trained = parabola(4e-2), set(FIT.lr_grid)
    losses = lambda rate: curve(rate) if rate in trained else None  # noqa: E731
    first = search_rates(FIT, losses)
    assert first.missing == (pytest.approx(1.7e-2, rel=1e-2),) and first.chosen is None
    trained |= set(first.missing)
    second = search_rates(FIT, losses)
    trained |= set(second.missing)
    final = search_rates(FIT, losses)
    assert final.extended == (first.missing[0], second.missing[0]) and final.chosen == max(final.rates)
    assert final.edge == "high" and not final.fit.vertex_inside


def test_failed_runs_bound_the_stable_rates_and_the_highest_stable_rate_is_reported():
    def losses(rate):
        if rate > 7e-3:
            return [4.0, 9.0]  # one seed above the threshold
        return parabola(2.6e-3)(rate)
    search = search_rates(Protocol(**{**FIT.to_dict(), "max_extensions": 0}), losses, threshold=7.0)
    assert search.fit.highest_stable == pytest.approx(6e-3)
    assert search.fit.failed[FIT.lr_grid[-1]] == 1 and search.chosen <= 6e-3
    assert max(search.fit.window) <= 6e-3


def test_a_lowest_rate_that_fails_leaves_no_stable_rate():
    fit = fit_rate({1e-3: [math.nan, 4.0], 2e-3: [4.0, 4.0], 4e-3: [4.1, 4.1]})
    assert fit.highest_stable is None and fit.rate == 1e-3 and fit.coefficients is None


def test_final_seeds_are_fresh_and_primaries_get_more():
    protocol = Protocol(**{**FIT.to_dict(), "primary": ["standard", "block_attnres"], "secondary_seeds": 8})
    assert protocol.final_seeds({"residual": "standard"}, 16) == list(range(1000, 1016))
    assert protocol.final_seeds({"residual": "mhc"}, 16) == list(range(1000, 1008))
    assert not set(protocol.final_seeds({"residual": "mhc"}, 16)) & set(range(protocol.grid_seeds))


@pytest.mark.parametrize("values, message", [
    ({"choice": "fit", "final_seed_start": 1}, "final_seed_start must be at least grid_seeds"),
    ({"choice": "best"}, "protocol.choice must be one of"),
    ({"primary": ["standard"]}, "protocol.secondary_seeds"),
    ({"secondary_seeds": 4}, "needs protocol.primary"),
])
def test_a_protocol_whose_final_seeds_could_reuse_the_search_is_refused(values, message):
    with pytest.raises(RunConfigError, match=message):
        Protocol(lr_grid=(1e-3, 2e-3), **values)


def test_the_failure_threshold_is_the_unigram_entropy():
    assert unigram_entropy([0, 1, 2, 3], 8) == pytest.approx(math.log(4))
    assert unigram_entropy([5, 5, 5], 8) == 0.0
