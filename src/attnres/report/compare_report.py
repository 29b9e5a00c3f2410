"""The comparison report of `attnres compare`: figures, results.json, report.md and index.html.

`results` is the training side's output (schema in `write_report`); its statistics over seeds come
from `attnres.report.compare_summary.summarize`. The Markdown and HTML pages are rendered from one
list of blocks (`attnres.report.document`), so they carry the same content; every number they show
is in results.json (the input, its summary and the figure list).
"""

from __future__ import annotations

import json
from pathlib import Path

from attnres.common.atomic import write_atomic
from attnres.report.compare_summary import BASELINE, run_depth_stats, summarize
from attnres.report.document import dumps_json, fmt, jsonable, render_html, render_markdown
from attnres.report.names import slug, unique_name


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

def _write_figures(results: dict, summary: dict, out_dir: Path) -> list[tuple[str, str, str]]:
    """Draw every figure; returns (relative path, alt text, caption) in report order."""
    from attnres.report import plots  # matplotlib is slow to import: only when a report is written

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

    used: set[str] = set()
    for variant in results["variants"]:
        if variant["name"] not in routed:
            continue
        run = min(variant["runs"], key=lambda r: r["seed"])  # the report's reference seed
        stats = run_depth_stats(run)
        if not stats or not stats["source_names"]:
            continue
        name = unique_name(slug(variant["name"], fallback="variant"), used)
        rel = f"figures/routing_{name}.png"
        plots.plot_routing_heatmap(stats["source_names"], stats["mean_weights"], out_dir / rel,
                                   f"Routing weights: {variant['name']} (seed {run['seed']})")
        figures.append((rel, f"routing weights of {variant['name']}",
                        f"{variant['name']}, seed {run['seed']}: mean weight each router (row) gives each "
                        "source (column); blank cells are sources the router cannot see. e is the embedding, "
                        "d/b/D completed sub-layers/blocks, p the current block's partial sum."))
    return figures


# ---------------------------------------------------------------- documents

def _document(results: dict, summary: dict, figures: list[tuple[str, str, str]]) -> list[tuple]:
    """The report as blocks (see `attnres.report.document`)."""
    machine = results.get("machine") or {}
    machine_text = ", ".join(f"{k} {v}" for k, v in machine.items()) if isinstance(machine, dict) else str(machine)
    seeds = ", ".join(str(s) for s in results.get("seeds") or [])
    blocks = [("h1", f"attnres comparison: {results.get('preset', '')}")]
    if results.get("description"):
        blocks.append(("p", str(results["description"])))
    blocks += [("p", f"Created {results.get('created', '-')} on {machine_text or '-'}; seeds {seeds or '-'}.")]
    code_path = results.get("code_path")
    if code_path:
        blocks.append(("p", f"Code path: routing {code_path['routing']} (routing_impl={code_path['routing_impl']}), "
                            f"precision {code_path['precision']}."))
    blocks += [("code", results.get("command", "")),
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
