"""Inference for paired seed comparisons: t tests, Holm, TOST, Clopper-Pearson, random effects, the best variant.

References the project did not write: scipy.stats (ttest_1samp, ttest_rel, binomtest) and, where installed,
statsmodels (multipletests, ttost_paired, proportion_confint, combine_effects); plus cases worked by hand.
"""

import math

import numpy as np
import pytest
from scipy import stats

from attnres.analysis.inference import (
    best_by_paired_comparisons,
    clopper_pearson,
    holm,
    paired_t,
    random_effects,
    tost_paired,
)


def _samples():
    """Difference vectors of 2 to 12 seeds, some centred off zero, from a fixed generator."""
    rng = np.random.default_rng(20240611)
    return [rng.normal(loc, scale, size=n) for n, loc, scale in
            [(2, 0.1, 0.2), (3, -0.05, 0.03), (5, 0.0, 1.0), (8, -0.02, 0.01), (12, 0.3, 2.0)]]


# --- paired t -------------------------------------------------------------------------------------------------


def test_paired_t_worked_by_hand():
    # diffs 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3), df 2, t_{0.975, 2} = 4.303
    r = paired_t([1.0, 2.0, 3.0])
    assert (r.n, r.df) == (3, 2)
    assert r.mean == pytest.approx(2.0) and r.sd == pytest.approx(1.0) and r.se == pytest.approx(1 / math.sqrt(3))
    assert r.t == pytest.approx(2 * math.sqrt(3))
    assert r.ci[0] == pytest.approx(2 - 4.303 / math.sqrt(3), abs=1e-3)
    assert r.ci[1] == pytest.approx(2 + 4.303 / math.sqrt(3), abs=1e-3)
    assert r.p_less + r.p_greater == pytest.approx(1.0)
    assert r.p_two_sided == pytest.approx(2 * r.p_greater) and r.p_greater < 0.05 < r.p_two_sided  # 0.0370, 0.0741


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.01])
def test_paired_t_matches_scipy_ttest_1samp(alpha):
    for diffs in _samples():
        r = paired_t(diffs, alpha=alpha)
        ref = stats.ttest_1samp(diffs, 0.0)
        assert r.t == pytest.approx(ref.statistic, rel=1e-12)
        assert r.df == ref.df
        assert r.p_two_sided == pytest.approx(ref.pvalue, rel=1e-10)
        assert r.p_less == pytest.approx(stats.ttest_1samp(diffs, 0.0, alternative="less").pvalue, rel=1e-10)
        assert r.p_greater == pytest.approx(stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue, rel=1e-10)
        low, high = ref.confidence_interval(confidence_level=1 - alpha)
        assert r.ci == pytest.approx((low, high), rel=1e-10, abs=1e-14)
        # the two-sided test rejects exactly when the interval leaves out 0
        assert (r.p_two_sided < alpha) == (not r.ci[0] <= 0.0 <= r.ci[1])


def test_paired_t_of_variant_minus_standard_is_scipy_ttest_rel():
    rng = np.random.default_rng(7)
    seed_effect = rng.normal(0, 0.05, size=6)  # shared by both arms of a seed: pairing removes it
    standard = 3.2 + seed_effect + rng.normal(0, 0.005, size=6)
    variant = 3.18 + seed_effect + rng.normal(0, 0.005, size=6)
    r = paired_t(list(variant - standard))
    ref = stats.ttest_rel(variant, standard, alternative="less")
    assert r.t == pytest.approx(ref.statistic, rel=1e-12) and r.p_less == pytest.approx(ref.pvalue, rel=1e-10)
    assert r.p_less < 0.01 and r.ci[1] < 0  # the variant is lower, and the pairing shows it


def test_paired_t_with_no_spread():
    equal = paired_t([0.5, 0.5, 0.5])
    assert equal.sd == 0.0 and equal.t == math.inf and equal.p_greater == 0.0 and equal.p_less == 1.0
    assert equal.ci == (0.5, 0.5)
    zeros = paired_t([0.0, 0.0])  # identical runs: no evidence either way (scipy gives NaN here)
    assert zeros.t == 0.0 and zeros.p_two_sided == 1.0 and zeros.p_less == 0.5


# --- Holm -----------------------------------------------------------------------------------------------------


def test_holm_worked_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, 2 * 0.03 = 0.06, max(1 * 0.04, 0.06) = 0.06
    r = holm([0.01, 0.04, 0.03], alpha=0.05)
    assert r.adjusted == pytest.approx((0.03, 0.06, 0.06)) and isinstance(r.adjusted, tuple)
    assert r.rejected == (True, False, False)
    named = holm({"c": 0.04, "a": 0.01, "b": 0.03}, alpha=0.05)
    assert list(named.adjusted) == ["c", "a", "b"]  # the input's keys, in its order
    assert named.adjusted == pytest.approx({"c": 0.06, "a": 0.03, "b": 0.06})
    assert named.rejected == {"c": False, "a": True, "b": False}
    assert holm([0.6, 0.7]).adjusted == (1.0, 1.0)  # 1.2 capped, and monotone
    assert holm([0.3]).adjusted == (0.3,)
    assert holm([0.025, 0.5], alpha=0.05).rejected == (True, False)  # adjusted p equal to alpha rejects


def test_holm_matches_statsmodels_multipletests():
    pytest.importorskip("statsmodels")
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(3)
    cases = [[0.01, 0.04, 0.03], [0.025, 0.5], [0.2, 0.2, 0.001, 0.04, 0.04], list(rng.uniform(0, 0.1, 9)),
             list(rng.uniform(0, 1, 20)), [0.0, 1.0, 0.5]]
    for p in cases:
        for alpha in (0.05, 0.1):
            reject, corrected, _, _ = multipletests(p, alpha=alpha, method="holm")
            r = holm(p, alpha=alpha)
            assert r.adjusted == pytest.approx(tuple(corrected), rel=1e-12)
            assert r.rejected == tuple(bool(x) for x in reject)


# --- TOST -----------------------------------------------------------------------------------------------------


def test_tost_inside_and_outside_the_margin():
    rng = np.random.default_rng(11)
    noise = rng.normal(0, 0.002, size=8)
    inside = tost_paired(0.001 + noise, margin=0.02)
    assert inside.equivalent and inside.p < 0.001
    assert -0.02 < inside.ci[0] < inside.ci[1] < 0.02
    outside = tost_paired(0.05 + noise, margin=0.02)  # well beyond the margin: clearly not equivalent
    assert not outside.equivalent and outside.p > 0.99 and outside.ci[0] > 0.02
    assert outside.p == outside.p_upper and outside.p_lower < 1e-6
    # a mean inside the margin with too few, too noisy seeds is not shown equivalent either
    assert not tost_paired([0.0, 0.03, -0.03], margin=0.02).equivalent
    # mean 0, se 0.04, margin 0.1: both one-sided t are 2.5 with 4 df, p = 0.0334, between 0.025 and 0.05
    borderline = 0.04 * math.sqrt(2) * np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    at_5 = tost_paired(borderline, margin=0.1, alpha=0.05)
    assert at_5.p == pytest.approx(stats.t.sf(2.5, 4), rel=1e-9) and at_5.p_lower == pytest.approx(at_5.p_upper)
    assert at_5.equivalent and not tost_paired(borderline, margin=0.1, alpha=0.025).equivalent


def test_tost_decision_is_the_one_minus_two_alpha_interval_inside_the_margin():
    for diffs in _samples():
        for margin in (0.01, 0.1, 1.0, 3.0):
            r = tost_paired(diffs, margin, alpha=0.05)
            assert r.ci == pytest.approx(paired_t(diffs, alpha=0.10).ci, rel=1e-12)
            assert r.equivalent == (-margin < r.ci[0] and r.ci[1] < margin)
            assert r.p == max(r.p_lower, r.p_upper)


def test_tost_matches_statsmodels_ttost_paired():
    pytest.importorskip("statsmodels")
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(5)
    for n, shift in [(3, 0.0), (5, 0.01), (8, -0.03), (12, 0.05)]:
        standard = rng.normal(3.0, 0.05, size=n)
        variant = standard + shift + rng.normal(0, 0.02, size=n)
        for margin in (0.02, 0.05):
            p, (t1, p1, df1), (t2, p2, _) = ttost_paired(variant, standard, -margin, margin)
            r = tost_paired(variant - standard, margin)
            assert r.p == pytest.approx(p, rel=1e-9)
            assert (r.t_lower, r.p_lower) == pytest.approx((t1, p1), rel=1e-9)
            assert (r.t_upper, r.p_upper) == pytest.approx((t2, p2), rel=1e-9)
            assert r.df == df1 == n - 1


# --- Clopper-Pearson ------------------------------------------------------------------------------------------


def test_clopper_pearson_edges_by_hand():
    # 0 of n: low 0 and high solves (1 - p)^n = 0.025; n of n mirrors it
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)), rel=1e-12)
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0), rel=1e-12)
    assert clopper_pearson(0, 10)[0] == 0.0 and clopper_pearson(10, 10)[1] == 1.0
    assert clopper_pearson(0, 1, level=0.9) == pytest.approx((0.0, 0.95))
    low, high = clopper_pearson(3, 12)
    assert low < 3 / 12 < high


@pytest.mark.parametrize("failures,n", [(0, 5), (1, 5), (5, 5), (3, 12), (7, 40), (0, 100), (99, 100)])
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_clopper_pearson_matches_scipy_binomtest(failures, n, level):
    ref = stats.binomtest(failures, n).proportion_ci(confidence_level=level, method="exact")
    assert clopper_pearson(failures, n, level) == pytest.approx((ref.low, ref.high), rel=1e-9, abs=1e-12)


def test_clopper_pearson_matches_statsmodels_beta_interval():
    pytest.importorskip("statsmodels")
    from statsmodels.stats.proportion import proportion_confint

    for failures, n in [(0, 5), (1, 5), (5, 5), (3, 12), (7, 40), (0, 100), (99, 100)]:
        for level in (0.95, 0.8):
            ref = proportion_confint(failures, n, alpha=1 - level, method="beta")
            assert clopper_pearson(failures, n, level) == pytest.approx(ref, rel=1e-9, abs=1e-12)


# --- random effects -------------------------------------------------------------------------------------------


def test_random_effects_of_identical_effects_has_no_heterogeneity():
    variances = [0.01, 0.02, 0.04, 0.01]
    r = random_effects([0.3, 0.3, 0.3, 0.3], variances)
    assert (r.k, r.tau2, r.q, r.i2) == (4, 0.0, 0.0, 0.0)
    assert r.estimate == pytest.approx(0.3)
    se = 1 / math.sqrt(sum(1 / v for v in variances))
    assert r.se_z == pytest.approx(se)
    assert r.ci_z == pytest.approx((0.3 - 1.959964 * se, 0.3 + 1.959964 * se), rel=1e-6)
    # Hartung-Knapp scales by the observed spread, which is 0 here: the interval is the point itself
    assert r.hk_scale == 0.0 and r.ci_hk == pytest.approx((0.3, 0.3))


def test_random_effects_with_equal_variances_worked_by_hand():
    # equal variances v: tau^2 = max(0, s^2 - v) with s^2 the effects' sample variance, the estimate is their
    # mean, and the Hartung-Knapp interval is the one-sample t interval of the effects, whatever tau^2 is
    effects = [0.0, 1.0, 2.0, 3.0]  # mean 1.5, s^2 = 5/3
    r = random_effects(effects, [0.1] * 4)
    assert r.tau2 == pytest.approx(5 / 3 - 0.1) and r.estimate == pytest.approx(1.5)
    assert r.ci_hk == pytest.approx(paired_t(effects).ci, rel=1e-12)
    assert r.q == pytest.approx((5 / 3) * 3 / 0.1) and r.i2 == pytest.approx(1 - 3 / r.q)
    assert r.se_z == pytest.approx(math.sqrt((0.1 + r.tau2) / 4))
    small = random_effects([1.0, 1.1, 0.9], [1.0, 1.0, 1.0], level=0.9)  # s^2 = 0.01 < v: tau^2 = 0
    assert small.tau2 == 0.0 and small.i2 == 0.0
    assert small.ci_hk == pytest.approx(paired_t([1.0, 1.1, 0.9], alpha=0.1).ci, rel=1e-12)


@pytest.mark.filterwarnings("ignore:.*requires `nobs` for each sample")  # its per-study rows, not used here
def test_random_effects_matches_statsmodels_combine_effects_hksj():
    pytest.importorskip("statsmodels")
    from statsmodels.stats.meta_analysis import combine_effects

    effects = np.array([-0.031, -0.012, -0.045, 0.004, -0.020])
    variances = np.array([0.00004, 0.00009, 0.00006, 0.00012, 0.00005])  # Q > k - 1: tau^2 > 0
    for level in (0.95, 0.9):
        alpha = 1 - level
        ref = combine_effects(effects, variances, method_re="dl", use_t=True, alpha=alpha)
        r = random_effects(effects, variances, level=level)
        assert ref.tau2 > 0 and r.tau2 == pytest.approx(ref.tau2, rel=1e-10)
        assert r.estimate == pytest.approx(ref.mean_effect_re, rel=1e-12)
        assert r.q == pytest.approx(ref.q, rel=1e-12) and r.i2 == pytest.approx(ref.i2, rel=1e-10)
        assert r.se_z == pytest.approx(ref.sd_eff_w_re, rel=1e-12)
        _, ci_re, _, ci_re_wls = ref.conf_int(alpha=alpha, use_t=True)
        # statsmodels: "random effect wls" is the estimated-scale (HKSJ) interval, t with k - 1 df
        assert r.ci_hk == pytest.approx(tuple(ci_re_wls), rel=1e-10)
        assert r.se_hk == pytest.approx(ref.sd_eff_w_re_hksj, rel=1e-10)
        frame = ref.summary_frame(alpha=alpha, use_t=True)
        assert r.ci_hk == pytest.approx(tuple(frame.loc["random effect wls", ["ci_low", "ci_upp"]]), rel=1e-10)
        _, ci_re_z, _, _ = ref.conf_int(alpha=alpha, use_t=False)
        assert r.ci_z == pytest.approx(tuple(ci_re_z), rel=1e-10)
        assert r.ci_hk != pytest.approx(tuple(ci_re))  # HK is not merely the t quantile on the usual SE


def test_random_effects_truncated_tau2_matches_statsmodels():
    # With Q < k - 1 DerSimonian-Laird's tau^2 is truncated at 0 (statsmodels' "dl" leaves it negative);
    # statsmodels' Paule-Mandel ("iterated") also stops at 0 there, so it is the reference for this case.
    pytest.importorskip("statsmodels")
    from statsmodels.stats.meta_analysis import combine_effects

    effects = np.array([0.10, 0.12, 0.09, 0.11])
    variances = np.array([0.01, 0.02, 0.015, 0.01])
    ref = combine_effects(effects, variances, method_re="iterated", use_t=True)
    r = random_effects(effects, variances)
    assert r.q < 3 and r.tau2 == 0.0 == ref.tau2 and r.i2 == 0.0
    assert r.estimate == pytest.approx(ref.mean_effect_re, rel=1e-12)
    assert r.ci_hk == pytest.approx(tuple(ref.conf_int(use_t=True)[3]), rel=1e-10)
    assert r.ci_z == pytest.approx(tuple(ref.conf_int(use_t=False)[1]), rel=1e-10)


# --- the best variant -----------------------------------------------------------------------------------------


def _losses(means, n_seeds=5, seed_sd=0.05, run_sd=0.004, seed=0):
    """Per-variant losses over shared seeds: a seed effect common to all variants plus run noise."""
    rng = np.random.default_rng(seed)
    seed_effect = rng.normal(0, seed_sd, size=n_seeds)
    return {name: list(mean + seed_effect + rng.normal(0, run_sd, size=n_seeds)) for name, mean in means.items()}


def test_a_clear_winner_is_shown_best():
    losses = _losses({"standard": 3.00, "attnres": 2.95, "block": 2.97, "hyper": 2.99})
    r = best_by_paired_comparisons(losses)
    assert r.candidate == "attnres" and r.shown_best
    assert set(r.adjusted_p) == {"standard", "block", "hyper"} and max(r.adjusted_p.values()) < 0.01
    assert all(d < 0 for d in r.mean_difference.values())
    for name, p in r.p.items():  # each comparison is scipy's paired one-sided t test
        assert p == pytest.approx(stats.ttest_rel(losses["attnres"], losses[name], alternative="less").pvalue,
                                  rel=1e-10)
    assert r.correction == "bonferroni" and r.adjusted_p == pytest.approx({k: 3 * p for k, p in r.p.items()})
    # the same decision from differences to standard (standard itself as zeros): the baseline cancels
    diffs = {name: list(np.subtract(v, losses["standard"])) for name, v in losses.items()}
    from_diffs = best_by_paired_comparisons(diffs)
    assert from_diffs.candidate == "attnres" and from_diffs.shown_best
    assert from_diffs.p == pytest.approx(r.p, rel=1e-6)


def test_two_near_identical_variants_are_not_separated():
    losses = _losses({"standard": 3.00, "attnres": 2.95, "attnres_copy": 2.95}, seed=1)
    r = best_by_paired_comparisons(losses)
    assert r.candidate in ("attnres", "attnres_copy") and not r.shown_best
    rival = "attnres_copy" if r.candidate == "attnres" else "attnres"
    assert r.adjusted_p[rival] > 0.05 and r.adjusted_p["standard"] < 0.05  # both beat standard, not each other


def test_an_exact_tie_is_not_shown_best():
    losses = {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0], "c": [2.0, 3.0, 4.5]}
    r = best_by_paired_comparisons(losses)
    assert r.candidate == "a" and not r.shown_best and r.p["b"] == 0.5


def test_holm_can_show_best_where_bonferroni_does_not():
    # candidate minus "close": -0.25 + c (-2, -1, 0, 1, 2) has se = c sqrt(2.5 / 5), so c = 0.1 sqrt(2) makes
    # t = -2.5 with 4 df, one-sided p = 0.0334: Holm passes it at alpha (the other comparison is far stronger),
    # Bonferroni doubles it
    base = np.array([3.0, 3.1, 2.9, 3.05, 2.95])
    diffs = -0.25 + 0.1 * math.sqrt(2) * np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    losses = {"cand": list(base), "close": list(base - diffs), "far": list(base + 1 + 0.01 * np.arange(5))}
    holm_r = best_by_paired_comparisons(losses, correction="holm")
    assert holm_r.p["close"] == pytest.approx(stats.t.sf(2.5, 4), rel=1e-9)
    assert holm_r.shown_best and holm_r.adjusted_p["close"] == pytest.approx(holm_r.p["close"])
    bonf = best_by_paired_comparisons(losses)  # the default, as the protocol's best-test
    assert not bonf.shown_best and bonf.adjusted_p["close"] == pytest.approx(2 * holm_r.p["close"])
    assert bonf.candidate == "cand" and bonf.correction == "bonferroni"


# --- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call,message", [
    (lambda: paired_t([0.1]), "diffs needs at least 2 values"),
    (lambda: paired_t([]), "diffs needs at least 2 values"),
    (lambda: paired_t([0.1, math.nan, 0.2]), "diffs must be finite.*index 1"),
    (lambda: paired_t([0.1, math.inf]), "diffs must be finite"),
    (lambda: paired_t([[0.1, 0.2], [0.3, 0.4]]), "one-dimensional"),
    (lambda: paired_t(["a", "b"]), "diffs must be a sequence of numbers"),
    (lambda: paired_t([0.1, 0.2], alpha=0.0), "alpha must be in \\(0, 1\\)"),
    (lambda: paired_t([0.1, 0.2], alpha=1.5), "alpha must be in \\(0, 1\\)"),
    (lambda: paired_t([0.1, 0.2], alpha=math.nan), "alpha must be in \\(0, 1\\)"),
    (lambda: holm([]), "p_values needs at least 1 value"),
    (lambda: holm([0.1, 1.2]), "p_values must lie in \\[0, 1\\].*position 1"),
    (lambda: holm({"a": math.nan}), "p_values must be finite"),
    (lambda: holm([0.1], alpha=-0.1), "alpha must be in"),
    (lambda: tost_paired([0.1, 0.2], margin=0.0), "margin must be positive"),
    (lambda: tost_paired([0.1, 0.2], margin=-1.0), "margin must be positive"),
    (lambda: tost_paired([0.1, 0.2], margin=math.inf), "margin must be positive and finite"),
    (lambda: tost_paired([0.1], margin=0.1), "diffs needs at least 2 values"),
    (lambda: tost_paired([0.1, 0.2], margin=0.1, alpha=0.5), "alpha must be in \\(0, 0.5\\)"),
    (lambda: clopper_pearson(3, 2), "failures must be in \\[0, n\\]"),
    (lambda: clopper_pearson(-1, 2), "failures must be in \\[0, n\\]"),
    (lambda: clopper_pearson(0, 0), "n must be at least 1"),
    (lambda: clopper_pearson(1.5, 4), "failures must be an integer"),
    (lambda: clopper_pearson(1, 4, level=1.0), "level must be in \\(0, 1\\)"),
    (lambda: random_effects([0.1], [0.01]), "effects needs at least 2 values"),
    (lambda: random_effects([0.1, 0.2], [0.01]), "variances needs at least 2 values"),
    (lambda: random_effects([0.1, 0.2, 0.3], [0.01, 0.02]), "same length"),
    (lambda: random_effects([0.1, 0.2], [0.01, 0.0]), "variances must be positive.*index 1"),
    (lambda: random_effects([0.1, math.nan], [0.01, 0.02]), "effects must be finite"),
    (lambda: random_effects([0.1, 0.2], [0.01, 0.02], level=0), "level must be in"),
    (lambda: best_by_paired_comparisons({"a": [1.0, 2.0]}), "at least 2 variants"),
    (lambda: best_by_paired_comparisons({"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}), "same number of seeds"),
    (lambda: best_by_paired_comparisons({"a": [1.0], "b": [2.0]}), "needs at least 2 values"),
    (lambda: best_by_paired_comparisons({"a": [1.0, 2.0], "b": [1.0, math.nan]}), "\\['b'\\] must be finite"),
    (lambda: best_by_paired_comparisons([[1.0, 2.0], [1.0, 2.0]]), "must be a dict"),
    (lambda: best_by_paired_comparisons({"a": [1.0, 2.0], "b": [0.0, 1.0]}, correction="tukey"), "correction"),
])
def test_bad_input_raises_value_error_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()
