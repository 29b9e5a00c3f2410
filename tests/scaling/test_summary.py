"""attnres.scaling.summary: on sweeps drawn from known laws, the summary recovers the laws and a known
compute advantage with an interval that holds it, refuses what cannot be fitted by name, and is
strict JSON."""

import copy
import json
import math

import numpy as np
import pytest

from attnres.report.document import jsonable
from attnres.scaling.fit import FitError, bootstrap_fits, fit_law
from attnres.scaling.summary import compute_grid, points_of, quantile_band, summarize_sweep
from tests.scaling.sweeps import ALPHA, COMPUTE, E, ahead, below_floor, standard_loss, sweep, variant

REPLICATES = 100
BLOCK, FULL, TWO_SIZES = "block_attnres (N=8)", "full_attnres", "delta_attnres"


@pytest.fixture(scope="module")
def summary():
    return summarize_sweep(sweep(seed=5), replicates=REPLICATES)


def test_the_summary_recovers_the_laws(summary):
    sat = summary["laws"]["saturating"]
    for name in ("standard", BLOCK, FULL):
        entry = sat[name]
        assert entry["points"] == 12 and entry["error"] is None and entry["replicates"] >= REPLICATES - 2
        assert entry["fit"]["alpha"] == pytest.approx(ALPHA, abs=0.01)
        assert entry["fit"]["e"] == pytest.approx(E, abs=0.05)
        assert entry["alpha"][0] < entry["fit"]["alpha"] < entry["alpha"][1]
        assert entry["e"][0] < entry["fit"]["e"] < entry["e"][1]
        assert entry["misfit"] is False  # the right law leaves residuals of about the seed noise
    std = sat["standard"]
    assert std["alpha"][0] < ALPHA < std["alpha"][1] and std["e"][0] < E < std["e"][1]
    c_max = summary["compute_range"][1]
    assert c_max == pytest.approx(COMPUTE[-1] * 1.06)  # full_attnres's FLOPs at the largest size
    at_max = std["loss_at_max"]
    assert at_max["low"] < standard_loss(c_max) < at_max["high"]
    assert at_max["value"] == pytest.approx(standard_loss(c_max), rel=0.003)
    # the band is the fitted curve over the log-spaced grid, its interval around it
    band = std["band"]
    assert band["compute"][0] == pytest.approx(COMPUTE[0]) and band["compute"][-1] == c_max
    assert np.allclose(np.diff(np.log(band["compute"])), np.log(c_max / COMPUTE[0]) / 40)
    assert all(lo <= y <= hi for lo, y, hi in zip(band["low"], band["loss"], band["high"]))
    # a saturating sweep is not a power law: the power fit misses by more than the seed noise
    assert summary["laws"]["power"]["standard"]["misfit"] is True
    assert "e" not in summary["laws"]["power"]["standard"]


def test_a_known_advantage_is_recovered_with_an_interval_that_excludes_one(summary):
    block = summary["advantage"]["saturating"][BLOCK]
    at = block["at_max"]
    assert at["compute"] == summary["compute_range"][1]
    assert at["value"] == pytest.approx(1.3, abs=0.05)
    assert at["low"] < 1.3 < at["high"] and at["low"] > 1.0
    assert block["range"][0] <= at["value"] <= block["range"][1]
    assert block["curve"]["value"][-1] == at["value"] and block["curve"]["low"][-1] == at["low"]
    full = summary["advantage"]["saturating"][FULL]["at_max"]  # no advantage: its interval holds 1
    assert full["low"] < 1.0 < full["high"]
    assert "standard" not in summary["advantage"]["saturating"]


def test_the_advantage_interval_comes_from_paired_replicates(summary):
    """The interval is the percentile interval of compute_advantage over replicate pairs, made by one
    bootstrap_fits call for all fittable variants."""
    variants = sweep(seed=5)
    fits = bootstrap_fits({v["name"]: points_of(v) for v in variants[:3]}, "saturating", REPLICATES)
    c_max = summary["compute_range"][1]
    values = [s.compute_for(b.loss(c_max)) / c_max for b, s in zip(fits[BLOCK], fits["standard"]) if b and s]
    lo, hi = np.percentile(values, [2.5, 97.5])
    at = summary["advantage"]["saturating"][BLOCK]["at_max"]
    assert (at["low"], at["high"]) == pytest.approx((lo, hi), rel=1e-9)


def test_a_variant_with_two_sizes_is_refused_for_the_saturating_law_not_made_up(summary):
    entry = summary["laws"]["saturating"][TWO_SIZES]
    assert entry["fit"] is None and entry["band"] is None and entry["alpha"] is None
    assert entry["points"] == 4
    points = points_of(sweep(seed=5)[3])
    with pytest.raises(FitError) as error:
        fit_law([p.compute for p in points], [p.loss for p in points])
    assert entry["error"] == str(error.value) and "needs at least as many distinct compute values" in entry["error"]
    assert summary["advantage"]["saturating"][TWO_SIZES]["error"] == f"no fit of {TWO_SIZES}"
    assert summary["advantage"]["saturating"][TWO_SIZES]["at_max"] is None
    # two sizes pin the two-parameter power law
    assert summary["laws"]["power"][TWO_SIZES]["fit"] is not None
    assert summary["advantage"]["power"][TWO_SIZES]["error"] is None


def test_a_sweep_without_exactly_one_standard_is_refused():
    variants = sweep()
    with pytest.raises(ValueError, match="exactly one variant with residual 'standard'"):
        summarize_sweep(variants[1:], replicates=5)
    twice = copy.deepcopy(variants[0])
    twice["name"] = "standard again"
    with pytest.raises(ValueError, match="exactly one variant"):
        summarize_sweep(variants + [twice], replicates=5)


def test_a_diverged_run_is_left_out_and_counted():
    variants = sweep(seed=5)
    variants[2]["runs"][3]["final_val_loss"] = float("nan")
    out = summarize_sweep(variants[:3], replicates=10)
    entry = out["laws"]["saturating"][FULL]
    assert entry["points"] == 11 and entry["excluded"] == 1 and entry["fit"] is not None


def test_the_summary_is_strict_json_and_infinite_advantages_are_none():
    rng = np.random.default_rng(1)
    variants = [variant("standard", "standard", ahead(1.0), rng),
                variant("denseformer", "denseformer", below_floor, rng)]
    out = summarize_sweep(variants, replicates=20)
    text = json.dumps(jsonable(out), allow_nan=False)
    assert json.loads(text) == out  # already JSON-ready: jsonable changes nothing
    at = out["advantage"]["saturating"]["denseformer"]["at_max"]
    assert at["value"] is None and at["beyond_floor_share"] == 1.0  # below standard's floor: infinite
    curve = out["advantage"]["saturating"]["denseformer"]["curve"]["value"]
    assert curve[0] is not None and curve[-1] is None
    assert out["settings"] == {"replicates": 20, "confidence": 0.95, "bootstrap": "residuals", "seed": 0,
                               "grid_points": 41, "misfit_factor": 2.0, "robust_loss": out["settings"]["robust_loss"]}
    assert "soft-L1" in out["settings"]["robust_loss"]


def test_quantile_band_matches_numpy_and_keeps_infinite_ends():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(101, 3))
    low, high = quantile_band(x, 0.9)
    assert np.allclose(low, np.percentile(x, 5, axis=0)) and np.allclose(high, np.percentile(x, 95, axis=0))
    x[:5, 0] = np.inf  # 5 of 101 infinite: the 95th percentile (the 96th value of 101) is still finite
    assert math.isfinite(quantile_band(x, 0.9)[1][0])
    x[:6, 0] = np.inf  # 6: it is infinite, not a number made up by dropping the infinite ones
    low, high = quantile_band(x, 0.9)
    assert math.isinf(high[0]) and math.isfinite(low[0]) and high[1] == pytest.approx(np.percentile(x[:, 1], 95))
    assert np.isnan(quantile_band(np.empty((0, 2)), 0.9)[0]).all()


def test_the_grid_spans_every_run_and_the_cases_bootstrap_runs():
    variants = sweep(seed=5)[:2]
    grid = compute_grid(variants, 5)
    assert len(grid) == 5 and grid[0] == COMPUTE[0] and grid[-1] == pytest.approx(COMPUTE[-1] * 1.02)
    out = summarize_sweep(variants, replicates=30, bootstrap="cases", grid_points=5)
    assert out["settings"]["bootstrap"] == "cases" and len(out["laws"]["power"]["standard"]["band"]["loss"]) == 5
    assert out["advantage"]["power"][BLOCK]["at_max"]["value"] > 1


def test_a_law_through_as_many_runs_as_parameters_has_no_interval_not_a_zero_width_one():
    # three sizes, one seed each: the saturating law passes through every point; the residual bootstrap
    # would redraw zero residuals and return that fit every time
    rng = np.random.default_rng(3)
    one_seed = [variant("standard", "standard", ahead(1.0), rng, sizes=(0, 2, 5)),
                variant(BLOCK, "block_attnres", ahead(1.3), rng, sizes=(0, 2, 5), num_blocks=8)]
    for v in one_seed:
        v["runs"] = [r for r in v["runs"] if r["seed"] == 0]
    summary = summarize_sweep(one_seed, replicates=50)
    sat = summary["laws"]["saturating"]["standard"]
    assert sat["fit"] is not None and sat["fit"]["rms_log_residual"] < 1e-6
    assert sat["replicates"] == 0 and sat["alpha"] == [None, None] and sat["loss_at_max"]["low"] is None
    assert "3 parameters and 3 runs" in sat["no_interval"]
    advantage = summary["advantage"]["saturating"][BLOCK]
    assert advantage["replicates"] == 0 and advantage["at_max"]["low"] is None
    assert advantage["no_interval"] == (f"{BLOCK} and standard have as many runs as the law has parameters, so no "
                                        f"residual to resample")
    power = summary["laws"]["power"]["standard"]  # two parameters, three runs: one residual degree of freedom
    assert power["no_interval"] is None and power["replicates"] > 0
