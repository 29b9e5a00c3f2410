"""Statistics of a comparison over seeds: `summarize` turns `attnres compare` results into per-variant numbers.

`results` is the training side's output (schema in `attnres.report.compare_report.write_report`);
the interval statistics themselves are in `attnres.analysis.intervals`.
"""

from __future__ import annotations

import math
import numbers

from attnres.analysis.expert_load import load_imbalance
from attnres.analysis.intervals import ci95_halfwidth, mean, sample_std
from attnres.analysis.sharpness import summarize_max_weights
from attnres.common.errors import InputError
from attnres.train.timing import ratio, ratio_spread, round_ratios
from attnres.report.variant_names import entry_options

BASELINE = "standard"
REQUIRED_VARIANT_KEYS = ("name", "residual", "runs")
REQUIRED_RUN_KEYS = ("seed", "val_curve", "final_val_loss", "depth_stats")
# The summary's cost keys (`cost_summary`); all None where results hold no cost measurement.
COST_KEYS = ("step_time_s", "step_time_ratio", "step_time_low", "step_time_high", "step_time_coverage",
             "step_time_spread", "step_time_noisy", "peak_memory_bytes", "activation_bytes",
             "peak_memory_ratio", "activation_ratio")
# A run record's "stability" totals (`attnres.train.stability.run_totals`) that the summary carries per variant.
STABILITY_KEYS = ("loss_spikes", "grad_spikes", "clip_rate")


def _checked_variants(results: dict) -> list[dict]:
    """The variant list, checked for the keys the report needs; ValueError naming what is missing."""
    if not isinstance(results, dict) or not results.get("variants"):
        raise ValueError("results must be a dict with a non-empty 'variants' list")
    names = set()
    for i, variant in enumerate(results["variants"]):
        label = variant.get("name", f"#{i}") if isinstance(variant, dict) else f"#{i}"
        for key in REQUIRED_VARIANT_KEYS:
            if not isinstance(variant, dict) or key not in variant:
                raise ValueError(f"variant {label!r} lacks required key {key!r}")
        if variant["name"] in names:
            raise InputError(f"variant name {variant['name']!r} appears twice")
        names.add(variant["name"])
        if not variant["runs"]:
            raise ValueError(f"variant {label!r} has no runs")
        for j, run in enumerate(variant["runs"]):
            for key in REQUIRED_RUN_KEYS:
                if key not in run:
                    raise ValueError(f"variant {label!r}, run {j} (seed {run.get('seed', '?')}) "
                                     f"lacks required key {key!r}")
            if not isinstance(run["final_val_loss"], numbers.Real):
                raise ValueError(f"variant {label!r}, run {j}: final_val_loss must be a number, "
                                 f"got {run['final_val_loss']!r}")
    baselines = [v for v in results["variants"] if v["residual"] == BASELINE]
    if len(baselines) != 1:
        raise InputError(f"results need exactly one variant with residual {BASELINE!r} as the baseline, "
                         f"got residuals {[v['residual'] for v in results['variants']]}")
    return results["variants"]


def run_depth_stats(run: dict) -> dict | None:
    """A run's depth statistics as a dict (`DepthStats.to_dict()`), whether stored as object or dict."""
    stats = run["depth_stats"]
    return stats.to_dict() if hasattr(stats, "to_dict") else stats


def _mean_by_position(rows: list[list]) -> list[float | None]:
    """Elementwise mean over rows of possibly different lengths, skipping None; None where all are None."""
    width = max((len(r) for r in rows), default=0)
    columns = [[r[i] for r in rows if i < len(r) and r[i] is not None] for i in range(width)]
    return [mean(c) for c in columns]


def _average_curve(curves: list[list]) -> list[list[float]]:
    """[[step, value], ...] per seed -> [[step, mean, std], ...] over the seeds that have each step."""
    by_step: dict[float, list[float]] = {}
    for curve in curves:
        for point in curve:
            if point[1] is not None:
                by_step.setdefault(point[0], []).append(float(point[1]))
    return [[step, mean(v), sample_std(v)] for step, v in sorted(by_step.items())]


def stability_summary(runs: list[dict]) -> dict:
    """For each of STABILITY_KEYS: `<key>_by_seed` (each run's total in run order, None for a run recorded
    before events were counted) and `<key>_mean` (the mean over the runs that have it; None if none)."""
    out = {}
    for key in STABILITY_KEYS:
        by_seed = [(run.get("stability") or {}).get(key) for run in runs]
        out[f"{key}_by_seed"] = by_seed
        out[f"{key}_mean"] = mean([float(value) for value in by_seed if value is not None])
    return out


def expert_summary(runs: list[dict]) -> dict:
    """Expert balance of a mixture-of-experts variant from its runs' held-out `expert_load`:
    expert_imbalance_by_seed (each run's largest imbalance over its MoE layers, the largest expert
    load over the mean; None for a run without experts), expert_imbalance_mean (over the runs that
    have it; None if none) and expert_imbalance_by_layer (per MoE layer, mean over runs)."""
    per_run = [[load_imbalance(layer) for layer in run["expert_load"]] if run.get("expert_load") else None
               for run in runs]
    by_seed = [max(layers) if layers else None for layers in per_run]
    return {"expert_imbalance_by_seed": by_seed,
            "expert_imbalance_mean": mean([value for value in by_seed if value is not None]),
            "expert_imbalance_by_layer": _mean_by_position([layers for layers in per_run if layers])}


def cost_summary(cost: dict | None, name: str, baseline: str = BASELINE) -> dict:
    """The cost figures of variant `name` from results["cost"] (`attnres.compare.cost_measurement.measure_costs`):
    step_time_s (median seconds of its training step), step_time_ratio (median over rounds of its
    step / standard's step in the same round), step_time_low / step_time_high (the distribution-free
    90 % interval of that median, `attnres.train.timing.median_interval`: with 5 to 7 rounds the
    lowest and highest per-round ratio), step_time_coverage (the interval's exact coverage),
    step_time_spread ((high - low) / ratio), step_time_noisy (spread above the measurement's
    noise_threshold), peak_memory_bytes, activation_bytes and their ratios to
    standard's. Every value None when `cost` is None or lacks the variant or the baseline."""
    variants = (cost or {}).get("variants") or {}
    if name not in variants or baseline not in variants:
        return dict.fromkeys(COST_KEYS)
    mine, base = variants[name], variants[baseline]
    spread = ratio_spread(round_ratios(mine["train_step_s"]["samples_s"], base["train_step_s"]["samples_s"]),
                          cost["settings"]["noise_threshold"])
    memory, base_memory = mine.get("memory") or {}, base.get("memory") or {}
    return {"step_time_s": mine["train_step_s"]["median_s"], "step_time_ratio": spread["ratio"],
            "step_time_low": spread["low"], "step_time_high": spread["high"], "step_time_coverage": spread["coverage"],
            "step_time_spread": spread["spread"], "step_time_noisy": spread["noisy"],
            "peak_memory_bytes": memory.get("peak_bytes"), "activation_bytes": memory.get("activation_bytes"),
            "peak_memory_ratio": ratio(memory.get("peak_bytes"), base_memory.get("peak_bytes")),
            "activation_ratio": ratio(memory.get("activation_bytes"), base_memory.get("activation_bytes"))}


def _summarize_variant(variant: dict) -> dict:
    runs = variant["runs"]
    losses = [float(r["final_val_loss"]) for r in runs]
    ppl = [math.exp(x) if not x > 700 else math.inf for x in losses]  # a diverged run must not crash
    stats = [s for s in map(run_depth_stats, runs) if s]
    deep = [summarize_max_weights(s["max_weight"])["max_weight_deep"] for s in stats]
    deep = [d for d in deep if d is not None]
    options = entry_options(variant)
    out = {"residual": variant["residual"], "residual_options": options.to_dict() if options else None,
           "query_init": variant.get("query_init"), "seeds": [r["seed"] for r in runs],
           "val_loss_mean": mean(losses), "val_loss_std": sample_std(losses), "val_loss_ci95": ci95_halfwidth(losses),
           "ppl_mean": mean(ppl), "ppl_std": sample_std(ppl), "ppl_ci95": ci95_halfwidth(ppl),
           "max_weight_deep": mean(deep),
           "max_weight_by_depth": _mean_by_position([s["max_weight"] for s in stats]),
           "hidden_rms_by_depth": _mean_by_position([s["hidden_rms"] for s in stats]),
           "val_curve": _average_curve([r["val_curve"] for r in runs]),
           "train_curve": _average_curve([r.get("train_curve") or [] for r in runs])}
    return {**out, **stability_summary(runs), **expert_summary(runs)}


def summarize(results: dict) -> dict:
    """Per variant name (input order): statistics over its seeds, relative to `standard`.

    Each entry: val_loss_mean, val_loss_std (sample std, 0.0 for one seed), val_loss_ci95 (half-width
    of the Student-t 95 % interval of the mean, `ci95_halfwidth`; None for one seed), ppl_mean,
    ppl_std, ppl_ci95 (of exp(final_val_loss) per seed), delta_vs_standard (val_loss_mean minus
    standard's), the cost keys of `cost_summary` (from results["cost"], the measurement after
    training; None without one), max_weight_deep (mean over seeds of the mean max weight of
    the deepest third of multi-source routers; None if none), max_weight_by_depth and
    hidden_rms_by_depth (per router / per depth, mean over seeds), val_curve and train_curve
    ([[step, mean, std], ...] over seeds), the divergence events of `stability_summary`
    (loss_spikes_mean / _by_seed, grad_spikes_*, clip_rate_*; None where not recorded), the expert
    balance of `expert_summary` (None without experts), plus residual,
    residual_options (every option, from the variant's fields in any version's names) and query_init
    (for its figure style), and seeds.
    Raises ValueError if `standard` is missing or a run lacks a required key.
    """
    variants = _checked_variants(results)
    baseline = next(v for v in variants if v["residual"] == BASELINE)
    summary = {v["name"]: _summarize_variant(v) for v in variants}
    base_loss = summary[baseline["name"]]["val_loss_mean"]
    for name, entry in summary.items():
        entry.update(cost_summary(results.get("cost"), name, baseline["name"]))
        entry["delta_vs_standard"] = entry["val_loss_mean"] - base_loss
    return summary
