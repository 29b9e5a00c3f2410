"""Tests and intervals for a pre-registered comparison of variants over seeds.

A variant is compared with standard by paired differences of test loss, one per seed (variant minus
standard, same seed): lower loss is better, so a negative mean difference favours the variant.

- `paired_t`: Student t test and interval of the mean difference (n - 1 degrees of freedom).
- `holm`: Holm's step-down adjusted p-values for a family of tests.
- `tost_paired`: equivalence within a margin by two one-sided t tests (TOST).
- `clopper_pearson`: the exact binomial interval of a rate (diverged runs out of n, say).
- `random_effects`: DerSimonian-Laird pooling of effects with the Hartung-Knapp-Sidik-Jonkman interval.
- `best_by_paired_comparisons`: is the variant with the lowest mean loss shown better than every other?

Bad input (too few values, values that are not finite, a level outside (0, 1), ...) raises `InputError`,
a ValueError, with a message naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from attnres.common.errors import InputError


@dataclass(frozen=True)
class PairedTest:
    """A one-sample t test of paired differences (H0: mean difference 0), with a 1 - alpha interval.

    p_two_sided: H1 mean != 0; p_less: H1 mean < 0 (the variant has lower loss); p_greater: H1 mean > 0.
    ci: the two-sided 1 - alpha interval (low, high) of the mean difference.
    """

    n: int
    mean: float
    sd: float
    se: float
    df: int
    t: float
    p_two_sided: float
    p_less: float
    p_greater: float
    ci: tuple[float, float]
    alpha: float


@dataclass(frozen=True)
class HolmResult:
    """Holm-adjusted p-values and rejections at alpha, in the input's keys (a dict) or order (a tuple)."""

    adjusted: dict[str, float] | tuple[float, ...]
    rejected: dict[str, bool] | tuple[bool, ...]
    alpha: float


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided t tests (TOST) of -margin < mean difference < margin.

    p_lower tests H0 mean <= -margin (t_lower = (mean + margin) / se), p_upper tests H0 mean >= margin
    (t_upper = (mean - margin) / se); p is the larger of the two and `equivalent` is p < alpha, the same as
    the 1 - 2 alpha interval `ci` lying strictly inside (-margin, margin).
    """

    n: int
    mean: float
    sd: float
    se: float
    df: int
    margin: float
    t_lower: float
    p_lower: float
    t_upper: float
    p_upper: float
    p: float
    equivalent: bool
    ci: tuple[float, float]
    alpha: float


@dataclass(frozen=True)
class Pooled:
    """A random-effects pooled estimate (DerSimonian-Laird tau^2) of k effects.

    estimate: sum(w_i y_i) / sum(w_i) with w_i = 1 / (v_i + tau2). se_z and ci_z: the usual normal interval,
    se = 1 / sqrt(sum w_i). hk_scale, se_hk and ci_hk: Hartung-Knapp(-Sidik-Jonkman), hk_scale =
    sum w_i (y_i - estimate)^2 / (k - 1), se_hk = sqrt(hk_scale / sum w_i), Student t with k - 1 degrees of
    freedom. q: Cochran's Q (fixed-effect weights 1 / v_i); i2 = max(0, (q - (k - 1)) / q), 0 when q is 0.
    """

    k: int
    estimate: float
    tau2: float
    q: float
    i2: float
    se_z: float
    ci_z: tuple[float, float]
    hk_scale: float
    se_hk: float
    ci_hk: tuple[float, float]
    level: float


@dataclass(frozen=True)
class BestByComparisons:
    """Whether `candidate` (the lowest mean) is shown lower than every other variant.

    Per other variant j: mean_difference[j] = mean(candidate - j), p[j] the one-sided paired t p-value of
    H1 mean(candidate - j) < 0, adjusted_p[j] its value adjusted by `correction` ("holm" or "bonferroni")
    over the k - 1 comparisons. shown_best: every adjusted p is <= alpha.
    """

    candidate: str
    shown_best: bool
    mean_difference: dict[str, float]
    p: dict[str, float]
    adjusted_p: dict[str, float]
    alpha: float
    correction: str


def _check_probability(name: str, value: float) -> float:
    """`value` as a float if it lies strictly between 0 and 1, else InputError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number in (0, 1), got {value!r}")
    value = float(value)
    if not 0.0 < value < 1.0:  # also rejects NaN
        raise InputError(f"{name} must be in (0, 1), got {value!r}")
    return value


def _finite_values(name: str, values: Sequence[float], minimum: int = 2) -> np.ndarray:
    """`values` as a 1-D float array of at least `minimum` finite numbers, else InputError naming `name`."""
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise InputError(f"{name} must be a sequence of numbers: {error}") from None
    if array.ndim != 1:
        raise InputError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size < minimum:
        raise InputError(f"{name} needs at least {minimum} value{'s' if minimum > 1 else ''}, got {array.size}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise InputError(f"{name} must be finite: value {array[bad[0]]} at index {int(bad[0])}")
    return array


def _ratio(numerator: float, se: float) -> float:
    """numerator / se for a t statistic; with se == 0 (all values equal) +-inf, or 0.0 if numerator is 0."""
    if se > 0.0:
        return numerator / se
    return 0.0 if numerator == 0.0 else math.copysign(math.inf, numerator)


def _paired_summary(diffs: Sequence[float]) -> tuple[int, float, float, float, int]:
    """n, mean, sample standard deviation (n - 1), standard error of the mean and degrees of freedom
    (n - 1) of at least 2 finite `diffs`."""
    values = _finite_values("diffs", diffs)
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    return values.size, mean, sd, sd / math.sqrt(values.size), values.size - 1


def paired_t(diffs: Sequence[float], alpha: float = 0.05) -> PairedTest:
    """Student t test of paired differences (one per seed, e.g. variant minus standard test loss).

    Needs at least 2 finite differences; alpha in (0, 1) sets the two-sided 1 - alpha interval. Returns the
    mean, sample sd, standard error, t = mean / se with n - 1 degrees of freedom, the two-sided and both
    one-sided p-values, and the interval. If every difference is equal (sd 0), t is +-inf, or 0 when they
    are all 0 (no evidence either way).
    """
    from scipy.stats import t as student_t  # scipy.stats takes about a second to import

    alpha = _check_probability("alpha", alpha)
    n, mean, sd, se, df = _paired_summary(diffs)
    t = _ratio(mean, se)
    half = float(student_t.isf(alpha / 2, df)) * se
    return PairedTest(
        n=n, mean=mean, sd=sd, se=se, df=df, t=t,
        p_two_sided=min(1.0, 2.0 * float(student_t.sf(abs(t), df))),
        p_less=float(student_t.cdf(t, df)), p_greater=float(student_t.sf(t, df)),
        ci=(mean - half, mean + half), alpha=alpha)


def holm(p_values: Mapping[str, float] | Sequence[float], alpha: float = 0.05) -> HolmResult:
    """Holm's step-down adjustment of a family of p-values (a dict by name, or a sequence).

    With the m p-values sorted ascending, the i-th (1-based) adjusted value is the running maximum of
    (m - i + 1) * p_(i), capped at 1; a hypothesis is rejected when its adjusted p-value is <= alpha
    (Holm 1979). Returns the adjusted values and rejections keyed like the input (a dict) or in its order
    (tuples). Needs at least one p-value, each in [0, 1].
    """
    alpha = _check_probability("alpha", alpha)
    keys = list(p_values) if isinstance(p_values, Mapping) else None
    raw = [p_values[key] for key in keys] if keys is not None else list(p_values)
    values = _finite_values("p_values", raw, minimum=1)
    outside = np.flatnonzero((values < 0.0) | (values > 1.0))
    if outside.size:
        raise InputError(f"p_values must lie in [0, 1]: value {values[outside[0]]} at position {int(outside[0])}")
    m = values.size
    order = np.argsort(values, kind="stable")
    scaled = values[order] * (m - np.arange(m))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    rejected = [bool(p <= alpha) for p in adjusted]
    if keys is not None:
        return HolmResult(adjusted={key: float(p) for key, p in zip(keys, adjusted)},
                          rejected=dict(zip(keys, rejected)), alpha=alpha)
    return HolmResult(adjusted=tuple(float(p) for p in adjusted), rejected=tuple(rejected), alpha=alpha)


def tost_paired(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> Equivalence:
    """Equivalence of paired differences within +-margin by two one-sided t tests (Schuirmann's TOST).

    Needs at least 2 finite differences, margin > 0 (in the differences' unit, e.g. nats) and alpha in
    (0, 1). Returns both one-sided tests, p = their maximum, `equivalent` (p < alpha) and the 1 - 2 alpha
    interval of the mean difference that the decision corresponds to.
    """
    from scipy.stats import t as student_t  # scipy.stats takes about a second to import

    alpha = _check_probability("alpha", alpha)
    if alpha >= 0.5:
        raise InputError(f"alpha must be in (0, 0.5) for a 1 - 2 alpha interval, got {alpha!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float, np.integer, np.floating)):
        raise InputError(f"margin must be a positive number, got {margin!r}")
    margin = float(margin)
    if not (math.isfinite(margin) and margin > 0.0):
        raise InputError(f"margin must be positive and finite, got {margin!r}")
    n, mean, sd, se, df = _paired_summary(diffs)
    t_lower, t_upper = _ratio(mean + margin, se), _ratio(mean - margin, se)
    p_lower, p_upper = float(student_t.sf(t_lower, df)), float(student_t.cdf(t_upper, df))
    p = max(p_lower, p_upper)
    half = float(student_t.isf(alpha, df)) * se
    return Equivalence(
        n=n, mean=mean, sd=sd, se=se, df=df, margin=margin, t_lower=t_lower, p_lower=p_lower,
        t_upper=t_upper, p_upper=p_upper, p=p, equivalent=p < alpha, ci=(mean - half, mean + half), alpha=alpha)


def clopper_pearson(failures: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided `level` interval (low, high) of a rate seen as failures of n.

    failures and n are integers with 0 <= failures <= n and n >= 1. Each end uses (1 - level) / 2 from the
    beta quantiles; low is 0 for 0 failures and high is 1 for n failures.
    """
    from scipy.stats import beta  # scipy.stats takes about a second to import

    level = _check_probability("level", level)
    for name, value in (("failures", failures), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InputError(f"{name} must be an integer, got {value!r}")
    failures, n = int(failures), int(n)
    if n < 1:
        raise InputError(f"n must be at least 1, got {n}")
    if not 0 <= failures <= n:
        raise InputError(f"failures must be in [0, n] = [0, {n}], got {failures}")
    tail = (1.0 - level) / 2
    low = 0.0 if failures == 0 else float(beta.ppf(tail, failures, n - failures + 1))
    high = 1.0 if failures == n else float(beta.isf(tail, failures + 1, n - failures))
    return low, high


def random_effects(effects: Sequence[float], variances: Sequence[float], level: float = 0.95) -> Pooled:
    """Random-effects pooling of k >= 2 effects with known within-study variances (all > 0).

    tau^2 is DerSimonian-Laird's moment estimate, max(0, (Q - (k - 1)) / (S1 - S2 / S1)) with S1 = sum 1/v_i
    and S2 = sum 1/v_i^2. Returns the pooled estimate, tau^2, Q, I^2, the normal interval and the
    Hartung-Knapp(-Sidik-Jonkman) interval at `level` (see `Pooled`). The HK interval uses the observed
    spread of the effects: when they agree more closely than their variances imply (hk_scale < 1) it is
    narrower than the normal one, and it has width 0 when all effects are equal.
    """
    from scipy.stats import norm
    from scipy.stats import t as student_t  # scipy.stats takes about a second to import

    level = _check_probability("level", level)
    y = _finite_values("effects", effects)
    v = _finite_values("variances", variances)
    if v.size != y.size:
        raise InputError(f"effects and variances must have the same length, got {y.size} and {v.size}")
    nonpositive = np.flatnonzero(v <= 0.0)
    if nonpositive.size:
        raise InputError(f"variances must be positive: value {v[nonpositive[0]]} at index {int(nonpositive[0])}")
    k = y.size
    w_fixed = 1.0 / v
    s1 = float(w_fixed.sum())
    mean_fixed = float((w_fixed * y).sum()) / s1
    q = float((w_fixed * (y - mean_fixed) ** 2).sum())
    c = s1 - float((w_fixed ** 2).sum()) / s1
    tau2 = max(0.0, (q - (k - 1)) / c) if c > 0.0 else 0.0  # c is 0 only if one weight dominates to rounding
    i2 = max(0.0, (q - (k - 1)) / q) if q > 0.0 else 0.0
    w = 1.0 / (v + tau2)
    total = float(w.sum())
    estimate = float((w * y).sum()) / total
    se_z = 1.0 / math.sqrt(total)
    z = float(norm.isf((1.0 - level) / 2))
    hk_scale = float((w * (y - estimate) ** 2).sum()) / (k - 1)
    se_hk = math.sqrt(hk_scale / total)
    t_crit = float(student_t.isf((1.0 - level) / 2, k - 1))
    return Pooled(
        k=k, estimate=estimate, tau2=tau2, q=q, i2=i2, se_z=se_z, ci_z=(estimate - z * se_z, estimate + z * se_z),
        hk_scale=hk_scale, se_hk=se_hk, ci_hk=(estimate - t_crit * se_hk, estimate + t_crit * se_hk), level=level)


def best_by_paired_comparisons(losses_by_variant: Mapping[str, Sequence[float]], alpha: float = 0.05,
                               correction: str = "bonferroni") -> BestByComparisons:
    """Is the variant with the lowest mean shown lower than every other one? Paired one-sided t tests.

    losses_by_variant: per variant (at least 2) its per-seed losses, or differences to a common baseline
    (include the baseline as zeros to compare with it); the same seeds in the same order, all finite.
    The candidate is the lowest mean (the first on a tie). Each other variant j gets a one-sided paired
    t test of mean(candidate - j) < 0; the k - 1 p-values are adjusted by `correction` ("bonferroni":
    p (k - 1) capped at 1, or "holm") and the candidate is shown best when all are <= alpha.

    With Bonferroni this is a conservative form of Hsu's multiple comparison with the best for paired
    data (each comparison its own variance, no pooled one): the chance of declaring best a variant whose
    mean is above another's is at most alpha. Holm is not uniformly more conservative than Hsu's rule.
    "Not shown best" does not make the variants equivalent (`tost_paired`).
    """
    alpha = _check_probability("alpha", alpha)
    if correction not in ("holm", "bonferroni"):
        raise InputError(f"correction must be 'holm' or 'bonferroni', got {correction!r}")
    if not isinstance(losses_by_variant, Mapping):
        raise InputError(f"losses_by_variant must be a dict of name -> per-seed values, got {type(losses_by_variant)}")
    if len(losses_by_variant) < 2:
        raise InputError(f"losses_by_variant needs at least 2 variants, got {len(losses_by_variant)}")
    values = {name: _finite_values(f"losses_by_variant[{name!r}]", v) for name, v in losses_by_variant.items()}
    lengths = {name: v.size for name, v in values.items()}
    if len(set(lengths.values())) != 1:
        raise InputError(f"losses_by_variant must have the same number of seeds per variant, got {lengths}")
    means = {name: float(v.mean()) for name, v in values.items()}
    candidate = min(means, key=means.__getitem__)  # min keeps the first of equal means
    tests = {name: paired_t(values[candidate] - v, alpha=alpha) for name, v in values.items() if name != candidate}
    p = {name: test.p_less for name, test in tests.items()}
    if correction == "holm":
        adjusted = dict(holm(p, alpha=alpha).adjusted)
    else:
        adjusted = {name: min(1.0, value * len(p)) for name, value in p.items()}
    return BestByComparisons(
        candidate=candidate, shown_best=all(value <= alpha for value in adjusted.values()),
        mean_difference={name: test.mean for name, test in tests.items()}, p=p, adjusted_p=adjusted,
        alpha=alpha, correction=correction)
