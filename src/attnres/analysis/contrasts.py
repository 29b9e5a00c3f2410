"""The protocol's tests within one setting (docs/explanation/protocol.md, "Tests"): each variant's test loss
against standard's on the same seed, Holm's correction within its family (primary or secondary), equivalence
by two one-sided tests, the best-test among the primary variants, and failure rates with exact intervals.

Input is a comparison's results dict: "variants", each with "name", "residual" and "runs" of {"seed",
"final_test_loss"}, and optionally "protocol": {"failure_threshold"}.
"""

from __future__ import annotations

import math

from attnres.analysis.inference import best_by_paired_comparisons, clopper_pearson, holm, paired_t, tost_paired

MARGIN = 0.02  # nats: the equivalence margin the protocol states
ALPHA = 0.05


def _threshold(results: dict, threshold: float | None) -> float:
    return (results.get("protocol") or {}).get("failure_threshold", math.inf) if threshold is None else threshold


def _failed(loss, threshold: float) -> bool:
    return loss is None or not math.isfinite(loss) or loss > threshold


def _by_residual(results: dict) -> dict[str, dict]:
    """residual -> its variant entry (router ablations, named with '[...]', and repeats left out)."""
    out = {}
    for variant in results["variants"]:
        if "[" not in variant["name"] and variant["residual"] not in out:
            out[variant["residual"]] = variant
    return out


def paired_differences(results: dict, residuals=None, threshold: float | None = None,
                       key: str = "final_test_loss") -> dict[str, list[float]]:
    """Per variant (by residual; `residuals` keeps only those), its final test loss (`key`) minus standard's on
    the same seed, for the seeds both have, in seed order. A run that failed (loss not finite or above
    `threshold`, default the results' protocol.failure_threshold) counts at the threshold, against its variant."""
    threshold = _threshold(results, threshold)

    def losses(variant: dict) -> dict[int, float]:
        return {run["seed"]: threshold if _failed(run[key], threshold) else run[key]
                for run in variant["runs"] if key in run}

    variants = {r: losses(v) for r, v in _by_residual(results).items()}
    base = variants["standard"]
    keep = variants if residuals is None else {r: variants[r] for r in residuals if r in variants}
    return {residual: [values[s] - base[s] for s in sorted(set(values) & set(base))]
            for residual, values in keep.items() if residual != "standard"}


def failure_rates(results: dict, threshold: float | None = None) -> dict[str, dict]:
    """Per residual: failed final runs, runs, and the Clopper-Pearson 95 % interval of the failure rate."""
    threshold = _threshold(results, threshold)
    out = {}
    for residual, variant in _by_residual(results).items():
        n = len(variant["runs"])
        failed = sum(_failed(run.get("final_test_loss"), threshold) for run in variant["runs"])
        out[residual] = {"failed": failed, "runs": n, "interval": list(clopper_pearson(failed, n)) if n else None}
    return out


def _verdict(mean: float, holm_p: float | None, tost_p: float | None, alpha: float) -> str:
    if holm_p is not None and holm_p <= alpha:
        return "better" if mean < 0 else "worse"
    if tost_p is not None and tost_p < alpha:
        return "equivalent"
    return "not shown different"


def setting_tests(results: dict, primary, margin: float = MARGIN, alpha: float = ALPHA) -> dict:
    """The tests of one setting. primary: the primary residuals besides standard; every other variant is
    secondary, in its own Holm family. Returns {"contrasts": {residual: {"family", "n", "mean", "ci", "p",
    "holm_p", "tost_p", "verdict"}}, "best": {"candidate", "shown_best", "adjusted_p"} among the primary
    variants and standard (None with fewer than two), "failures": `failure_rates`, "margin", "alpha"}.
    verdict: "better" or "worse" than standard after Holm's correction, else "equivalent" within the margin by
    TOST, else "not shown different"."""
    diffs = paired_differences(results)
    families = {"primary": [r for r in diffs if r in primary], "secondary": [r for r in diffs if r not in primary]}
    contrasts = {}
    for family, members in families.items():
        tests = {r: paired_t(diffs[r], alpha=alpha) for r in members if len(diffs[r]) >= 2 and len(set(diffs[r])) > 1}
        adjusted = holm({r: t.p_two_sided for r, t in tests.items()}, alpha=alpha).adjusted if tests else {}
        for residual, test in tests.items():
            tost = tost_paired(diffs[residual], margin, alpha=alpha).p
            contrasts[residual] = {"family": family, "n": test.n, "mean": test.mean, "ci": list(test.ci),
                                   "p": test.p_two_sided, "holm_p": adjusted[residual], "tost_p": tost,
                                   "verdict": _verdict(test.mean, adjusted[residual], tost, alpha)}
    ranked = {"standard": [0.0] * len(next(iter(diffs.values()), [])),
              **{r: diffs[r] for r in families["primary"] if r in contrasts}}
    best = None
    if len(ranked) >= 2 and len({len(d) for d in ranked.values()}) == 1 and len(ranked["standard"]) >= 2:
        found = best_by_paired_comparisons(ranked, alpha=alpha)
        best = {"candidate": found.candidate, "shown_best": found.shown_best, "adjusted_p": found.adjusted_p}
    return {"contrasts": contrasts, "best": best, "failures": failure_rates(results), "margin": margin,
            "alpha": alpha}
