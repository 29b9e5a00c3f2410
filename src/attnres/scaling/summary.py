"""The fit summary of a scaling sweep: per variant and law, the fit, its bootstrap intervals and bands,
and every variant's compute advantage over standard (docs/explanation/scaling-law.md).

`summarize_sweep` turns the sweep's variants (each with its runs) into a JSON-ready dict that the
report (`attnres.report.scaling_report`) only renders. The bootstrap is paired: one `bootstrap_fits`
call per law holds every fittable variant, so replicate r of a variant and replicate r of standard
come from the same draws, and an advantage's interval is not widened by draws that differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from attnres.common.errors import InputError
from attnres.report.compare_summary import BASELINE
from attnres.report.document import jsonable
from attnres.scaling.fit import (LAWS, MISFIT_FACTOR, FitError, Point, ScalingFit, bootstrap_fits,
                                 compute_advantage, fit_law, percentile_interval, residuals_exceed_seed_spread,
                                 seed_spread)

ROBUST_LOSS = ("least squares on log loss with scipy's soft-L1 loss, scale 0.05: a run 5 % off the law counts "
               "linearly, not quadratically, so one diverged run does not drag the fit")


def baseline_of(variants: list[dict]) -> dict:
    """The one variant whose residual is "standard"; InputError when there is none or several."""
    found = [v for v in variants if v.get("residual") == BASELINE]
    if len(found) != 1:
        raise InputError(f"a sweep needs exactly one variant with residual {BASELINE!r} as the baseline, got "
                         f"residuals {[v.get('residual') for v in variants]}")
    return found[0]


def _usable(run: dict) -> bool:
    """A run that can be fitted: finite, positive compute and loss (a diverged run's NaN loss cannot)."""
    values = (run.get("flops"), run.get("final_val_loss"))
    return all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in values)


def points_of(variant: dict) -> list[Point]:
    """The fittable runs of `variant` as fit points: (flops, final_val_loss, size, seed)."""
    return [Point(float(r["flops"]), float(r["final_val_loss"]), str(r["size"]), int(r.get("seed", 0)))
            for r in variant["runs"] if _usable(r)]


def compute_grid(variants: list[dict], grid_points: int = 41) -> np.ndarray:
    """`grid_points` log-spaced computes from the smallest to the largest run's FLOPs (ends exact)."""
    flops = [float(r["flops"]) for v in variants for r in v["runs"] if _usable(r)]
    if not flops:
        raise FitError("no run has a finite, positive 'flops' and 'final_val_loss'")
    grid = np.geomspace(min(flops), max(flops), max(grid_points, 2))
    grid[0], grid[-1] = min(flops), max(flops)
    return grid


def quantile_band(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column of (replicates, G) `samples`, the percentile interval (linear interpolation, as
    `percentile_interval`), where +inf values (an advantage beyond standard's floor) count as the
    largest: an end that touches one is inf, not a number made up by dropping them. NaN with no rows."""
    if not len(samples):
        nan = np.full(samples.shape[1:], np.nan)
        return nan, nan
    ordered = np.sort(samples, axis=0)
    last = len(ordered) - 1
    ends = []
    for q in ((1 - confidence) / 2, (1 + confidence) / 2):
        pos = q * last
        i = int(math.floor(pos))
        frac = pos - i
        lo, hi = ordered[i], ordered[min(i + 1, last)]
        with np.errstate(invalid="ignore"):
            between = lo + frac * (hi - lo)
        ends.append(lo if frac == 0 else np.where(np.isinf(lo) | np.isinf(hi), np.inf, between))
    return ends[0], ends[1]


def _fit_or_error(points: Sequence[Point], law: str) -> tuple[ScalingFit | None, str | None]:
    try:
        return fit_law([p.compute for p in points], [p.loss for p in points], law), None
    except FitError as error:
        return None, str(error)


def no_interval(law: str, runs: int) -> str:
    """Why a fitted law has no interval: it has no residual degrees of freedom."""
    return (f"the {law} law has {LAWS[law]} parameters and {runs} runs to fit, so it passes through every point "
            f"and leaves no residual to resample")


def law_entry(law: str, fit: ScalingFit | None, error: str | None, points: list[Point], excluded: int,
              replicates: list[ScalingFit | None], grid: np.ndarray, confidence: float) -> dict:
    """One variant under one law: {"fit", "error", "points", "excluded" (runs without a finite loss),
    "replicates" (bootstrap fits made), "alpha": [lo, hi], "e": [lo, hi] (saturating only),
    "loss_at_max": {"value", "low", "high"}, "seed_spread", "misfit", "band": {"compute", "loss",
    "low", "high"} over `grid`, "no_interval": why a fitted law has no interval (as many runs as
    parameters) or None}; intervals and band are None without a fit."""
    entry = {"fit": None if fit is None else fit.to_dict(), "error": error, "points": len(points),
             "no_interval": None if fit is None or len(points) > LAWS[law] else no_interval(law, len(points)),
             "excluded": excluded, "replicates": 0, "alpha": None, "loss_at_max": None,
             "seed_spread": seed_spread(points), "misfit": None, "band": None}
    if law == "saturating":
        entry["e"] = None
    if fit is None:
        return entry
    made = [f for f in replicates if f is not None]
    bands = np.array([f.loss(grid) for f in made]).reshape(len(made), len(grid))
    low, high = quantile_band(bands, confidence)
    entry.update(replicates=len(made), alpha=list(percentile_interval([f.alpha for f in made], confidence)),
                 misfit=residuals_exceed_seed_spread(fit, points),
                 loss_at_max={"value": float(fit.loss(grid[-1])), "low": float(low[-1]),
                              "high": float(high[-1])},
                 band={"compute": grid.tolist(), "loss": fit.loss(grid).tolist(), "low": low.tolist(),
                       "high": high.tolist()})
    if law == "saturating":
        entry["e"] = list(percentile_interval([f.e for f in made], confidence))
    return entry


def advantage_entry(name: str, fits: dict, replicates: dict, baseline: str, grid: np.ndarray,
                    confidence: float) -> dict:
    """`name`'s compute advantage over `baseline` (`compute_advantage`) at the largest compute and over
    `grid`, with percentile intervals over the paired replicates where both fits were made:
    {"error", "replicates", "no_interval" (why there are no replicates, or None), "at_max": {"compute", "value", "low", "high", "beyond_floor_share"},
    "curve": {"compute", "value", "low", "high"}, "range": [min, max] of the curve}. inf (a loss
    below standard's floor) stays inf here; `jsonable` writes it as None."""
    missing = [n for n in (name, baseline) if fits[n] is None]
    exact = [n for n in (name, baseline) if not missing and not replicates[n]]
    if missing:
        return {"error": f"no fit of {' and '.join(missing)}", "replicates": 0, "at_max": None, "curve": None,
                "range": None}
    value = np.asarray(compute_advantage(fits[name], fits[baseline], grid), dtype=float)
    pairs = [(v, s) for v, s in zip(replicates[name], replicates[baseline]) if v is not None and s is not None]
    samples = np.array([compute_advantage(v, s, grid) for v, s in pairs]).reshape(len(pairs), len(grid))
    low, high = quantile_band(samples, confidence)
    share = float(np.isinf(samples[:, -1]).mean()) if len(pairs) else None
    return {"error": None, "replicates": len(pairs),
            "no_interval": (f"{' and '.join(exact)} {'has' if len(exact) == 1 else 'have'} as many runs as the law has "
                            f"parameters, so no residual to resample") if exact else None,
            "at_max": {"compute": float(grid[-1]), "value": float(value[-1]), "low": float(low[-1]),
                       "high": float(high[-1]), "beyond_floor_share": share},
            "curve": {"compute": grid.tolist(), "value": value.tolist(), "low": low.tolist(), "high": high.tolist()},
            "range": [float(value.min()), float(value.max())]}


def summarize_sweep(variants: list[dict], replicates: int = 1000, confidence: float = 0.95,
                    bootstrap: str = "residuals", seed: int = 0, grid_points: int = 41) -> dict:
    """The fit summary of a sweep, JSON-ready (inf and NaN as None).

    variants: [{"name", "residual", ..., "runs": [{"size", "seed", "flops", "final_val_loss", ...}]}],
    exactly one with residual "standard". Returns {"settings": {"replicates", "confidence",
    "bootstrap", "seed", "grid_points", "misfit_factor", "robust_loss"}, "baseline": standard's name,
    "compute_range": [C_min, C_max], "laws": {law: {name: `law_entry`}}, "advantage": {law: {name:
    `advantage_entry`}} (non-standard variants)}. A variant that cannot be fitted under a law (too few
    distinct computes) has fit None and the FitError's text, never a made-up fit.
    """
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be between 0 and 1, got {confidence!r}")
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise InputError(f"variant names must be unique, got {names}")
    baseline = baseline_of(variants)["name"]
    grid = compute_grid(variants, grid_points)
    points = {v["name"]: points_of(v) for v in variants}
    excluded = {v["name"]: len(v["runs"]) - len(points[v["name"]]) for v in variants}
    out = {"settings": {"replicates": replicates, "confidence": confidence, "bootstrap": bootstrap, "seed": seed,
                        "grid_points": len(grid), "misfit_factor": MISFIT_FACTOR, "robust_loss": ROBUST_LOSS},
           "baseline": baseline, "compute_range": [float(grid[0]), float(grid[-1])], "laws": {}, "advantage": {}}
    for law in LAWS:
        made = {name: _fit_or_error(pts, law) for name, pts in points.items()}
        fits = {name: fit for name, (fit, _) in made.items()}
        # a law through as many runs as it has parameters passes through every point: no residual is
        # left to resample, and a bootstrap would return that one fit every time (a zero-width interval)
        fittable = {name: points[name] for name, fit in fits.items()
                    if fit is not None and len(points[name]) > LAWS[law]}
        # one call for every fittable variant: replicate r shares its draws across variants (paired)
        reps = bootstrap_fits(fittable, law, replicates, seed, bootstrap) if fittable else {}
        reps = {name: reps.get(name, []) for name in names}
        out["laws"][law] = {name: law_entry(law, fits[name], made[name][1], points[name], excluded[name],
                                            reps[name], grid, confidence) for name in names}
        out["advantage"][law] = {name: advantage_entry(name, fits, reps, baseline, grid, confidence)
                                 for name in names if name != baseline}
    return jsonable(out)
