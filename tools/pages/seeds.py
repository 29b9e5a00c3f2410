"""Statistics over seeds of `attnres compare` results (results.json): losses by seed, differences paired by
seed, Student-t 95 % intervals as table cells, and the routing of the deepest routers.

A seed fixes the shared sub-layers' initial weights and the data order, so two variants' runs with
one seed differ only in the residual: differences are taken per seed, then averaged.
"""

from __future__ import annotations

import math

from attnres.analysis.intervals import ci95_halfwidth, mean, sample_std
from attnres.report.compare_report import signed
from attnres.report.document import fmt

DEEP_FRACTION = 1 / 3  # the compare report's "deepest third" of multi-source routers


def variants_by_name(results: dict) -> dict[str, dict]:
    """The variants of a compare results.json by their names (e.g. "block_attnres (N=8)")."""
    return {v["name"]: v for v in results["variants"]}


def losses_by_seed(variant: dict) -> dict[int, float]:
    """Seed -> final validation loss of one variant's runs."""
    return {run["seed"]: float(run["final_val_loss"]) for run in variant["runs"]}


def paired_by_seed(variant: dict, reference: dict) -> dict[int, float]:
    """Seed -> variant's final validation loss minus the reference's, for the seeds both have, in order."""
    mine, theirs = losses_by_seed(variant), losses_by_seed(reference)
    return {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}


def paired_difference(variant: dict, reference: dict) -> list[float]:
    """The paired differences of `paired_by_seed`, in seed order."""
    return list(paired_by_seed(variant, reference).values())


def interval(values: list[float], spec: str = ".3f") -> str:
    """'mean ± half-width' of the 95 % interval of the mean (the mean alone for one value)."""
    half = ci95_halfwidth(values)
    return fmt(mean(values), spec) if half is None else f"{fmt(mean(values), spec)} ± {fmt(half, spec)}"


def signed_interval(values: list[float]) -> str:
    """'+mean ± half-width' of the 95 % interval of differences (the signed mean alone for one value)."""
    half = ci95_halfwidth(values)
    return signed(mean(values)) if half is None else f"{signed(mean(values))} ± {half:.3f}"


def excludes_zero(values: list[float]) -> bool:
    """Whether the 95 % interval of the mean of `values` excludes 0 (False without an interval)."""
    half = ci95_halfwidth(values)
    return half is not None and abs(mean(values)) > half


def seed_range(values: list[float]) -> str:
    """'low to high' of per-seed differences, or '-' for fewer than two."""
    return "-" if len(values) < 2 else f"{signed(min(values))} to {signed(max(values))}"


def seed_sd(values: list[float]) -> float | None:
    """The seeds' sample standard deviation, None for fewer than two."""
    return sample_std(values) if len(values) > 1 else None


def deep_routing(run: dict) -> dict[str, float] | None:
    """Over the deepest third of one run's multi-source routers: the mean max weight, weight on the
    embedding, uniform weight 1/n and effective sources; None for a run without routers."""
    stats = run.get("depth_stats") or {}
    multi = [i for i, m in enumerate(stats.get("max_weight") or []) if m is not None]
    chosen = multi[len(multi) - max(1, round(len(multi) * DEEP_FRACTION)):] if multi else []
    if not chosen:
        return None
    effective = stats.get("effective_sources")
    return {"max_weight": mean([stats["max_weight"][i] for i in chosen]),
            "embedding_weight": mean([stats["mean_weights"][i][0] for i in chosen]),
            "uniform": mean([1 / len(stats["source_names"][i]) for i in chosen]),
            "effective_sources": mean([effective[i] for i in chosen]) if effective else math.nan}


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, the first column left-aligned and the rest right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
