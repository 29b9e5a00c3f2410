"""Scaling-law fits: loss against training compute, with bootstrap intervals (docs/explanation/scaling-law.md).

Two laws, fitted by robust least squares on log loss (scipy's `least_squares`, soft-L1 loss):

    saturating:  L(C) = A C^-alpha + E      (3 parameters; E is the irreducible loss)
    power:       L(C) = A C^-alpha          (2 parameters)

Compute is scaled by its geometric mean before fitting (A is reported for unscaled compute), so
the solver works on numbers near one at any FLOP count. Intervals come from a paired bootstrap over
model sizes, and over seeds within a size where a size has several (`bootstrap_fits`), and the
compute advantage of a variant over standard at a compute C is C_standard(L_variant(C)) / C: how
much more compute standard needs to reach the loss the variant reaches with C.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from attnres.common.errors import InputError

LAWS = {"saturating": 3, "power": 2}  # law -> number of parameters


class FitError(InputError):
    """A fit that cannot be made (too few points, bad values); the message says why."""


@dataclass(frozen=True)
class ScalingFit:
    """One fitted law: L(C) = a C^-alpha + e (e = 0 for the power law).

    law: "saturating" or "power"; points: how many (compute, loss) pairs; rms_log_residual: the
    root-mean-square residual of log loss; converged: the solver's success flag.
    """

    law: str
    a: float
    alpha: float
    e: float
    points: int
    rms_log_residual: float
    converged: bool

    def loss(self, compute: np.ndarray | float) -> np.ndarray | float:
        """The fitted loss at `compute` (FLOPs), any shape."""
        return self.a * np.power(compute, -self.alpha) + self.e

    def compute_for(self, loss: np.ndarray | float) -> np.ndarray | float:
        """The compute at which the fitted law reaches `loss`; inf at or below the floor e."""
        loss = np.asarray(loss, dtype=float)
        above = loss - self.e
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(above > 0, np.power(np.where(above > 0, above, 1.0) / self.a, -1.0 / self.alpha), np.inf)
        return out if out.ndim else float(out)

    def to_dict(self) -> dict:
        return {"law": self.law, "a": self.a, "alpha": self.alpha, "e": self.e, "points": self.points,
                "rms_log_residual": self.rms_log_residual, "converged": self.converged}


def _check_points(compute: Sequence[float], loss: Sequence[float], law: str) -> tuple[np.ndarray, np.ndarray]:
    if law not in LAWS:
        raise FitError(f"law must be one of {list(LAWS)}, got {law!r}")
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if c.shape != y.shape or c.ndim != 1:
        raise FitError(f"compute and loss must be 1-D and of one length, got shapes {c.shape} and {y.shape}")
    if not (np.isfinite(c).all() and np.isfinite(y).all() and (c > 0).all() and (y > 0).all()):
        raise FitError("compute and loss must be finite and positive")
    distinct = len(np.unique(c))
    if distinct < LAWS[law]:
        raise FitError(f"a {law} law has {LAWS[law]} parameters and needs at least as many distinct compute "
                       f"values, got {distinct} ({len(c)} points)")
    return c, y


def fit_law(compute: Sequence[float], loss: Sequence[float], law: str = "saturating",
            start: ScalingFit | None = None) -> ScalingFit:
    """Fit `law` to (compute, loss) pairs; `start`: a fit to begin from (a bootstrap starts each
    replicate from the full data's fit), else a line through the points in log-log. Raises FitError
    with fewer distinct compute values than the law has parameters, or for non-positive or
    non-finite values."""
    c, y = _check_points(compute, loss, law)
    scale = float(np.exp(np.log(c).mean()))
    log_x, log_y = np.log(c / scale), np.log(y)
    if start is not None and start.law == law:
        alpha0, log_a0 = start.alpha, math.log(start.a) - start.alpha * math.log(scale)
        log_e0 = math.log(max(start.e, 1e-12))
    else:
        slope, intercept = np.polyfit(log_x, log_y, 1)
        alpha0, log_e0 = max(-slope, 1e-3), math.log(0.5 * y.min())
        log_a0 = intercept if law == "power" else math.log(max(float(np.exp(intercept)) - 0.5 * y.min(), 1e-6))
    if law == "power":
        p0 = np.array([log_a0, alpha0])

        def residual(p):
            return p[0] - p[1] * log_x - log_y

        def jacobian(p):
            return np.stack([np.ones_like(log_x), -log_x], axis=1)
    else:
        p0 = np.array([log_a0, alpha0, log_e0])

        def residual(p):  # log(A x^-alpha + E) - log L, with A = exp(p0), E = exp(p2) > 0
            return np.logaddexp(p[0] - p[1] * log_x, p[2]) - log_y

        def jacobian(p):
            w = 1.0 / (1.0 + np.exp(p[2] - (p[0] - p[1] * log_x)))  # d/du logaddexp(u, p2)
            return np.stack([w, -w * log_x, 1.0 - w], axis=1)
    result = least_squares(residual, p0, jac=jacobian, loss="soft_l1", f_scale=0.05, method="trf",
                           ftol=1e-12, xtol=1e-12, gtol=1e-12)
    p = result.x
    r = residual(p)
    a_scaled, alpha = float(np.exp(p[0])), float(p[1])
    e = 0.0 if law == "power" else float(np.exp(p[2]))
    return ScalingFit(law, a_scaled * scale ** alpha, alpha, e, len(c), float(np.sqrt(np.mean(r ** 2))),
                      bool(result.success))


@dataclass(frozen=True)
class Point:
    """One training run: its compute (FLOPs), final loss, model size (the bootstrap's group) and seed."""

    compute: float
    loss: float
    size: str
    seed: int = 0


def _by_size(points: Sequence[Point]) -> dict[str, list[Point]]:
    by_size: dict[str, list[Point]] = {}
    for p in points:
        by_size.setdefault(p.size, []).append(p)
    return by_size


def resample(points: Sequence[Point], rng: np.random.Generator, sizes: Sequence[str]) -> list[Point]:
    """A bootstrap replicate: `sizes` drawn with replacement (given, so replicates of several variants
    share them: paired), then each drawn size's seeds drawn with replacement."""
    by_size = _by_size(points)
    out = []
    for size in sizes:
        runs = by_size.get(size, [])
        out += [runs[i] for i in rng.integers(0, len(runs), len(runs))] if runs else []
    return out


BOOTSTRAPS = ("residuals", "cases")


def bootstrap_fits(points_by_variant: dict[str, Sequence[Point]], law: str = "saturating", replicates: int = 1000,
                   seed: int = 0, method: str = "residuals") -> dict[str, list[ScalingFit | None]]:
    """`replicates` paired bootstrap fits per variant (None where a replicate cannot be fitted).

    method "residuals": each run keeps its compute; its log loss is the full fit's value plus a
    residual drawn with replacement from the fit's residuals (centred, scaled by sqrt(n / (n - p))
    for the p fitted parameters), the same draws for every variant with as many runs (paired).
    "cases": the model sizes drawn with replacement, shared by every variant, then seeds within
    each drawn size; with few sizes a replicate often lacks the range to pin the law and the
    intervals come out wide (over 95 % coverage of the truth in synthetic tests).
    """
    if not isinstance(replicates, int) or replicates < 1:
        raise FitError(f"replicates must be a positive integer, got {replicates!r}")
    if method not in BOOTSTRAPS:
        raise FitError(f"bootstrap method must be one of {list(BOOTSTRAPS)}, got {method!r}")
    full = {name: fit_law([p.compute for p in pts], [p.loss for p in pts], law) for name, pts in points_by_variant.items()}
    rng = np.random.default_rng(seed)
    out: dict[str, list[ScalingFit | None]] = {name: [] for name in points_by_variant}
    sizes = sorted({p.size for pts in points_by_variant.values() for p in pts})
    residuals = {}  # method "residuals": per variant, compute, fitted log loss, scaled centred residuals
    if method == "residuals":
        for name, pts in points_by_variant.items():
            c = np.array([p.compute for p in pts])
            fitted = np.log(full[name].loss(c))
            r = np.log([p.loss for p in pts]) - fitted
            residuals[name] = (c, fitted, (r - r.mean()) * math.sqrt(len(r) / max(len(r) - LAWS[law], 1)))
    for _ in range(replicates):
        drawn_sizes = [sizes[i] for i in rng.integers(0, len(sizes), len(sizes))] if method == "cases" else []
        drawn_rows: dict[int, np.ndarray] = {}  # one draw per run count, shared by the variants (paired)
        for name, pts in points_by_variant.items():
            if method == "cases":
                sample = resample(pts, rng, drawn_sizes)
                c, y = [p.compute for p in sample], [p.loss for p in sample]
            else:
                c, fitted, r = residuals[name]
                if len(r) not in drawn_rows:
                    drawn_rows[len(r)] = rng.integers(0, len(r), len(r))
                y = np.exp(fitted + r[drawn_rows[len(r)]])
            try:
                out[name].append(fit_law(c, y, law, start=full[name]))
            except FitError:
                out[name].append(None)
    return out


def compute_advantage(variant: ScalingFit, standard: ScalingFit, compute: np.ndarray | float) -> np.ndarray | float:
    """C_standard(L_variant(C)) / C at `compute`: above 1, the variant needs less compute for its loss."""
    return standard.compute_for(variant.loss(compute)) / np.asarray(compute, dtype=float)


def percentile_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The (lower, upper) percentile interval of the finite `values`; (nan, nan) when none is finite."""
    finite = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if not len(finite):
        return math.nan, math.nan
    tail = 100 * (1 - confidence) / 2
    return float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))


def seed_spread(points: Sequence[Point]) -> float | None:
    """The pooled standard deviation of log loss between seeds of one size, or None without a size
    that has two seeds: the noise a fit's residuals should not exceed."""
    squares, dof = 0.0, 0
    for runs in _by_size(points).values():
        logs = [math.log(p.loss) for p in runs]
        if len(logs) > 1:
            squares += float(np.sum((np.asarray(logs) - np.mean(logs)) ** 2))
            dof += len(logs) - 1
    return math.sqrt(squares / dof) if dof else None


MISFIT_FACTOR = 2.0  # a correct law's residuals are about the seed noise itself; twice it is a miss


def residuals_exceed_seed_spread(fit: ScalingFit, points: Sequence[Point], factor: float = MISFIT_FACTOR) -> bool | None:
    """True when the fit's RMS log residual is more than `factor` times the seeds' pooled spread
    (`seed_spread`): the law misses the points by more than the noise between seeds explains (a
    correct law leaves residuals of about the seed noise itself, hence the factor); None without a
    size that has two seeds."""
    spread = seed_spread(points)
    return None if spread is None else fit.rms_log_residual > factor * spread
