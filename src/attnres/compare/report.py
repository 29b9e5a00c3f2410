"""The comparison report: summary statistics over seeds, figures, results.json, report.md and index.html.

`results` is the training side's output (schema in `write_report`). The Markdown and HTML pages are
rendered from one list of blocks, so they carry the same content; every number they show is in
results.json (the input, its summary and the figure list).
"""

from __future__ import annotations

import json
import math
import numbers
import re
import statistics
from pathlib import Path

from attnres.analysis.document import dumps_json, fmt, jsonable, render_html, render_markdown, write_atomic
from attnres.analysis.sharpness import summarize_max_weights

BASELINE = "standard"
REQUIRED_VARIANT_KEYS = ("name", "residual", "runs")
REQUIRED_RUN_KEYS = ("seed", "val_curve", "final_val_loss", "step_time_s", "peak_memory_bytes",
                     "activation_bytes", "depth_stats")
# summary key -> run key; each a median over seeds divided by standard's median.
COST_RATIOS = {"step_time_ratio": "step_time_s", "peak_memory_ratio": "peak_memory_bytes",
               "activation_ratio": "activation_bytes"}


# ---------------------------------------------------------------- validation

def _variants(results: dict) -> list[dict]:
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
            raise ValueError(f"variant name {variant['name']!r} appears twice")
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
        raise ValueError(f"results need exactly one variant with residual {BASELINE!r} as the baseline, "
                         f"got residuals {[v['residual'] for v in results['variants']]}")
    return results["variants"]


# ---------------------------------------------------------------- summary

def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _std(values: list[float]) -> float:
    """Sample standard deviation; 0.0 for a single value; NaN if a value is not finite (a diverged run)."""
    if not all(math.isfinite(v) for v in values):
        return math.nan  # statistics.stdev raises on inf/nan
    return statistics.stdev(values) if len(values) > 1 else 0.0


# Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1 .. 10; beyond that 1.96 is within 12 %.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def ci95_halfwidth(values: list[float]) -> float | None:
    """Half-width of the 95 % confidence interval of the mean (Student t, sample std); None for
    one value (no interval), NaN if a value is not finite."""
    n = len(values)
    if n < 2:
        return None
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    return t * _std(values) / math.sqrt(n)


def _exp(x: float) -> float:
    return math.exp(x) if not x > 700 else math.inf  # a diverged run must not crash the report


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and math.isfinite(x)


def _median_ratio(values: list, base: list) -> float | None:
    """median(values) / median(base); None when any value is missing or the base is not positive."""
    if not all(_finite(v) for v in values + base):
        return None
    denominator = statistics.median(base)
    return statistics.median(values) / denominator if denominator > 0 else None


def _stats(run: dict) -> dict | None:
    stats = run["depth_stats"]
    return stats.to_dict() if hasattr(stats, "to_dict") else stats


def _mean_by_position(rows: list[list]) -> list[float | None]:
    """Elementwise mean over rows of possibly different lengths, skipping None; None where all are None."""
    width = max((len(r) for r in rows), default=0)
    columns = [[r[i] for r in rows if i < len(r) and r[i] is not None] for i in range(width)]
    return [_mean(c) for c in columns]


def _average_curve(curves: list[list]) -> list[list[float]]:
    """[[step, value], ...] per seed -> [[step, mean, std], ...] over the seeds that have each step."""
    by_step: dict[float, list[float]] = {}
    for curve in curves:
        for point in curve:
            if point[1] is not None:
                by_step.setdefault(point[0], []).append(float(point[1]))
    return [[step, _mean(v), _std(v)] for step, v in sorted(by_step.items())]


def _summarize_variant(variant: dict, baseline: dict) -> dict:
    runs = variant["runs"]
    losses = [float(r["final_val_loss"]) for r in runs]
    ppl = [_exp(x) for x in losses]
    stats = [s for s in map(_stats, runs) if s]
    deep = [summarize_max_weights(s["max_weight"])["max_weight_deep"] for s in stats]
    deep = [d for d in deep if d is not None]
    out = {"residual": variant["residual"], "num_blocks": variant.get("num_blocks"),
           "seeds": [r["seed"] for r in runs],
           "val_loss_mean": _mean(losses), "val_loss_std": _std(losses), "val_loss_ci95": ci95_halfwidth(losses),
           "ppl_mean": _mean(ppl), "ppl_std": _std(ppl), "ppl_ci95": ci95_halfwidth(ppl)}
    for key, run_key in COST_RATIOS.items():
        out[key] = _median_ratio([r[run_key] for r in runs], [r[run_key] for r in baseline["runs"]])
    out["max_weight_deep"] = _mean(deep)
    out["max_weight_by_depth"] = _mean_by_position([s["max_weight"] for s in stats])
    out["hidden_rms_by_depth"] = _mean_by_position([s["hidden_rms"] for s in stats])
    out["val_curve"] = _average_curve([r["val_curve"] for r in runs])
    out["train_curve"] = _average_curve([r.get("train_curve") or [] for r in runs])
    return out


def summarize(results: dict) -> dict:
    """Per variant name (input order): statistics over its seeds, relative to `standard`.

    Each entry: val_loss_mean, val_loss_std (sample std, 0.0 for one seed), val_loss_ci95 (half-width
    of the Student-t 95 % interval of the mean; None for one seed), ppl_mean, ppl_std, ppl_ci95 (of
    exp(final_val_loss) per seed), delta_vs_standard (val_loss_mean minus standard's),
    step_time_ratio, peak_memory_ratio, activation_ratio (median over seeds / standard's median;
    None if a value is missing), max_weight_deep (mean over seeds of the mean max weight of the
    deepest third of multi-source routers; None if none), max_weight_by_depth and
    hidden_rms_by_depth (per router / per depth, mean over seeds), val_curve and train_curve
    ([[step, mean, std], ...] over seeds), plus residual, num_blocks and seeds.
    Raises ValueError if `standard` is missing or a run lacks a required key.
    """
    variants = _variants(results)
    baseline = next(v for v in variants if v["residual"] == BASELINE)
    summary = {v["name"]: _summarize_variant(v, baseline) for v in variants}
    base_loss = summary[baseline["name"]]["val_loss_mean"]
    for entry in summary.values():
        entry["delta_vs_standard"] = entry["val_loss_mean"] - base_loss
    return summary


# ---------------------------------------------------------------- formatting

def signed(value, decimals: int = 3) -> str:
    """'+0.012' / '-0.034'; a rounding residue like -4e-16 prints as +0.000, not -0.000."""
    return "-" if value is None else f"{round(value, decimals) + 0.0:+.{decimals}f}"


def _pm(mean, std, n: int, spec: str) -> str:
    """'mean ± std' over seeds; the mean alone for one seed, whose std says nothing."""
    return fmt(mean, spec) if n < 2 else f"{fmt(mean, spec)} ± {fmt(std, spec)}"


def _interval(mean, halfwidth) -> str:
    """'[low, high]' of a 95 % interval; '-' for one seed."""
    if halfwidth is None or mean is None:
        return "-"
    return f"[{fmt(mean - halfwidth, '.2f')}, {fmt(mean + halfwidth, '.2f')}]"


RESULT_HEADER = ["variant", "val loss (mean ± std)", "perplexity (mean ± std)", "perplexity 95% CI", "Δ loss vs standard",
                 "step time ×", "peak memory ×", "max weight (deepest third)"]


def result_row(name: str, entry: dict, is_baseline: bool) -> list[str]:
    """One row of the results table, as report.md and index.html print it."""
    n = len(entry["seeds"])
    return [name, _pm(entry["val_loss_mean"], entry["val_loss_std"], n, ".3f"),
            _pm(entry["ppl_mean"], entry["ppl_std"], n, ".2f"), _interval(entry["ppl_mean"], entry.get("ppl_ci95")),
            "baseline" if is_baseline else signed(entry["delta_vs_standard"]),
            fmt(entry["step_time_ratio"], ".2f", "×"), fmt(entry["peak_memory_ratio"], ".2f", "×"),
            fmt(entry["max_weight_deep"], ".3f")]


RUN_HEADER = ["variant", "seed", "final val loss", "step time (s)", "peak memory (bytes)",
              "activations (bytes)", "tokens/s"]


def _run_row(name: str, run: dict) -> list[str]:
    return [name, str(run["seed"]), fmt(run["final_val_loss"], ".3f"), fmt(run["step_time_s"], ".3f"),
            fmt(run["peak_memory_bytes"], ",.0f"), fmt(run["activation_bytes"], ",.0f"),
            fmt(run.get("tokens_per_s"), ",.1f")]


def _compact(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _settings_rows(settings) -> list[list[str]]:
    if not isinstance(settings, dict):
        return [["settings", _compact(settings)]]
    rows = []
    for section, values in settings.items():
        text = (", ".join(f"{k}={_compact(v)}" for k, v in values.items()) if isinstance(values, dict)
                else _compact(values))
        rows.append([str(section), text])
    return rows


# ---------------------------------------------------------------- figures

def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-") or "variant"


def _write_figures(results: dict, summary: dict, out_dir: Path) -> list[tuple[str, str, str]]:
    """Draw every figure; returns (relative path, alt text, caption) in report order."""
    from attnres.analysis import plots  # matplotlib only when a report is written

    fig_dir = out_dir / "figures"
    preset = results.get("preset", "")
    seeds = len(results.get("seeds") or []) or max(len(e["seeds"]) for e in summary.values())
    routed = {n: e for n, e in summary.items() if e["residual"] != BASELINE}
    figures = []

    plots.plot_loss_curves({n: e["val_curve"] for n, e in summary.items()}, fig_dir / "val_loss.png",
                           f"Validation loss ({preset}, {seeds} seed{'s' * (seeds != 1)})")
    figures.append(("figures/val_loss.png", "validation loss against step",
                    "Validation loss against training step, mean over seeds; the shaded band is ± one "
                    "standard deviation across seeds. Lower is better."))
    plots.plot_cost_ratios({n: {"step time": e["step_time_ratio"], "peak memory": e["peak_memory_ratio"],
                                "activations": e["activation_ratio"]} for n, e in routed.items()},
                           fig_dir / "cost.png", "Cost relative to standard (median over seeds)")
    figures.append(("figures/cost.png", "cost ratios",
                    "Step time, peak memory and activation memory of each variant divided by standard's "
                    "(medians over seeds); bars above the dashed line at 1.0 cost more than standard."))
    plots.plot_max_weight_by_depth({n: e["max_weight_by_depth"] for n, e in routed.items()},
                                   fig_dir / "max_weight_by_depth.png", "Routing sharpness by depth")
    figures.append(("figures/max_weight_by_depth.png", "max routing weight by depth",
                    "Token-mean of each router's largest weight, mean over seeds: 1/n means uniform over n "
                    "sources, 1 means one source takes everything. Single-source routers are left out."))
    plots.plot_hidden_rms_by_depth({n: e["hidden_rms_by_depth"] for n, e in summary.items()},
                                   fig_dir / "hidden_rms_by_depth.png", "Hidden-state RMS by depth")
    figures.append(("figures/hidden_rms_by_depth.png", "hidden-state RMS by depth",
                    "RMS of each sub-layer's input h_s and of the final hidden state, mean over seeds; "
                    "a steady rise with depth is the growth that dilutes deep layers' contributions."))

    used = set()
    for variant in results["variants"]:
        if variant["name"] not in routed:
            continue
        run = min(variant["runs"], key=lambda r: r["seed"])  # the report's reference seed
        stats = _stats(run)
        if not stats or not stats["source_names"]:
            continue
        slug = _slug(variant["name"])
        while slug in used:
            slug += "-x"
        used.add(slug)
        rel = f"figures/routing_{slug}.png"
        plots.plot_routing_heatmap(stats["source_names"], stats["mean_weights"], out_dir / rel,
                                   f"Routing weights: {variant['name']} (seed {run['seed']})")
        figures.append((rel, f"routing weights of {variant['name']}",
                        f"{variant['name']}, seed {run['seed']}: mean weight each router (row) gives each "
                        "source (column); blank cells are sources the router cannot see. e is the embedding, "
                        "d/b/D completed sub-layers/blocks, p the current block's partial sum."))
    return figures


# ---------------------------------------------------------------- documents

def _document(results: dict, summary: dict, figures: list[tuple[str, str, str]]) -> list[tuple]:
    """The report as blocks: ("h1"|"h2"|"p"|"code", text), ("figure", path, alt, caption) and
    ("table", header, rows, numeric), where numeric right-aligns every column after the first."""
    machine = results.get("machine") or {}
    machine_text = ", ".join(f"{k} {v}" for k, v in machine.items()) if isinstance(machine, dict) else str(machine)
    seeds = ", ".join(str(s) for s in results.get("seeds") or [])
    blocks = [("h1", f"attnres comparison: {results.get('preset', '')}")]
    if results.get("description"):
        blocks.append(("p", str(results["description"])))
    blocks += [("p", f"Created {results.get('created', '-')} on {machine_text or '-'}; seeds {seeds or '-'}."),
               ("code", results.get("command", "")),
               ("h2", "Settings"), ("table", ["section", "settings"], _settings_rows(results.get("settings", {})), False),
               ("h2", "Results"),
               ("table", RESULT_HEADER, [result_row(name, entry, entry["residual"] == BASELINE)
                                         for name, entry in summary.items()], True),
               ("p", "Validation loss in nats/token at the end of training, mean ± sample std over seeds; "
                     "perplexity = exp(loss), averaged per seed; its 95% CI is the Student-t interval of that mean over "
                     "seeds (none for one seed). Step time and peak memory are medians over "
                     "seeds divided by standard's. Peak memory is the CUDA allocator's peak on a GPU; on a CPU it is "
                     "an estimate: weights + gradients + two AdamW moments + the activations saved for backward "
                     "(measured). Step times come from the training loop, variants run one after another. Max weight: token-mean of the largest routing weight over "
                     "the deepest third of multi-source routers (1 = routing picks one source)."),
               ("h2", "Runs"),
               ("table", RUN_HEADER, [_run_row(v["name"], r) for v in results["variants"] for r in v["runs"]], True),
               ("h2", "Figures")]
    blocks += [("figure", path, alt, caption) for path, alt, caption in figures]
    return blocks


# ---------------------------------------------------------------- files

def write_report(results: dict, out_dir: Path) -> list[Path]:
    """Write results.json, figures/*.png, report.md and index.html into out_dir; returns their paths.

    results: {"preset", "command", "created", "machine": {...}, "settings": {...}, "seeds": [...],
    "variants": [{"name", "residual", "num_blocks", "runs": [{"seed", "val_curve": [[step, loss]],
    "train_curve", "final_val_loss", "step_time_s", "peak_memory_bytes", "activation_bytes",
    "tokens_per_s", "tokens", "depth_stats": DepthStats.to_dict()}, ...]}, ...]}, with exactly one
    variant whose residual is "standard" (the baseline). results.json is the input plus "summary"
    (`summarize`) and "figures" (relative paths). Routing heatmaps use each variant's lowest seed.
    """
    summary = summarize(results)  # validates before anything is written
    out_dir = Path(out_dir)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    figures = _write_figures(results, summary, out_dir)
    full = jsonable({**results, "summary": summary, "figures": [path for path, _, _ in figures]})
    blocks = _document(results, summary, figures)
    written = [write_atomic(out_dir / "results.json", dumps_json(full) + "\n"),
               write_atomic(out_dir / "report.md", render_markdown(blocks)),
               write_atomic(out_dir / "index.html", render_html(blocks))]
    return written + [out_dir / path for path, _, _ in figures]
