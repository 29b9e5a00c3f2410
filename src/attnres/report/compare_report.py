"""The comparison report of `attnres compare`: figures, results.json, report.md and index.html.

`results` is the training side's output (schema in `write_report`); its statistics over seeds come
from `attnres.report.compare_summary.summarize`. The Markdown and HTML pages are rendered from one
list of blocks (`attnres.report.document`), so they carry the same content; every number they show
is in results.json (the input, its summary and the figure list).
"""

from __future__ import annotations

from pathlib import Path

from attnres.common.machine import cpu_facts
from attnres.report.variant_names import entry_options
from attnres.report.compare_summary import BASELINE, run_depth_stats, summarize
from attnres.report.document import compact, fmt, plus_minus, write_document
from attnres.report.names import slug, unique_name
from attnres.train.train_config import TrainConfig


# ---------------------------------------------------------------- formatting

def signed(value, decimals: int = 3) -> str:
    """'+0.012' / '-0.034'; a rounding residue like -4e-16 prints as +0.000, not -0.000."""
    return "-" if value is None else f"{round(value, decimals) + 0.0:+.{decimals}f}"


def _interval(mean, halfwidth) -> str:
    """'[low, high]' of a 95 % interval; '-' for one seed."""
    if halfwidth is None or mean is None:
        return "-"
    return f"[{fmt(mean - halfwidth, '.2f')}, {fmt(mean + halfwidth, '.2f')}]"


RESULT_HEADER = ["variant", "val loss (mean ± std)", "perplexity (mean ± std)", "perplexity 95% CI", "Δ loss vs standard",
                 "train step × (range)", "peak memory ×", "max weight (deepest third)"]


def step_ratio_cell(entry: dict, is_baseline: bool = False) -> str:
    """The training-step ratio as a table prints it: "2.04× (1.95–2.10)" with the per-round range,
    "noisy (0.98–2.61×)" when the range is too wide to quote a number, "-" when not measured."""
    ratio, low, high = entry.get("step_time_ratio"), entry.get("step_time_low"), entry.get("step_time_high")
    if ratio is None:
        return "-"
    if is_baseline:
        return fmt(ratio, ".2f", "×")
    if entry.get("step_time_noisy"):
        return f"noisy ({low:.2f}–{high:.2f}×)"
    return f"{ratio:.2f}× ({low:.2f}–{high:.2f})"


def result_row(name: str, entry: dict, is_baseline: bool) -> list[str]:
    """One row of the results table, as report.md and index.html print it (mean ± std over seeds; the
    mean alone for one seed, whose std says nothing)."""
    several = len(entry["seeds"]) > 1
    return [name, plus_minus(entry["val_loss_mean"], entry["val_loss_std"] if several else None, ".3f"),
            plus_minus(entry["ppl_mean"], entry["ppl_std"] if several else None, ".2f"),
            _interval(entry["ppl_mean"], entry.get("ppl_ci95")),
            "baseline" if is_baseline else signed(entry["delta_vs_standard"]),
            step_ratio_cell(entry, is_baseline), fmt(entry.get("peak_memory_ratio"), ".2f", "×"),
            fmt(entry["max_weight_deep"], ".3f")]


COST_HEADER = ["variant", "train step (ms)", "step × standard", "per-round range", "peak memory (MiB)", "peak ×",
               "activations (MiB)", "activations ×"]


def cost_row(name: str, entry: dict, is_baseline: bool) -> list[str]:
    """One row of the cost table: the median step, its ratio to standard ("noisy" instead of a number
    when the rounds disagree too much), the per-round range, memory and its ratios."""
    ratio, low, high = entry.get("step_time_ratio"), entry.get("step_time_low"), entry.get("step_time_high")
    shown = "baseline" if is_baseline else "noisy" if entry.get("step_time_noisy") else fmt(ratio, ".2f", "×")
    span = "-" if is_baseline or low is None else f"{low:.2f}–{high:.2f}×"
    mib = {key: None if entry.get(key) is None else entry[key] / 2**20 for key in ("peak_memory_bytes", "activation_bytes")}
    return [name, fmt(None if entry.get("step_time_s") is None else entry["step_time_s"] * 1e3, ".1f"), shown, span,
            fmt(mib["peak_memory_bytes"], ".1f"), fmt(entry.get("peak_memory_ratio"), ".2f", "×"),
            fmt(mib["activation_bytes"], ".1f"), fmt(entry.get("activation_ratio"), ".2f", "×")]


RUN_HEADER = ["variant", "seed", "final val loss", "training step, wall (s)", "tokens/s while training"]
STABILITY_HEADER = ["variant", "loss spikes", "grad-norm spikes", "clip rate"]
NOT_RECORDED = "n/a"  # a run recorded before divergence events were counted


def per_seed_cell(entry: dict, key: str, mean_spec: str, seed_spec: str) -> str:
    """The mean over seeds of a summary entry's `key` (its `<key>_mean`), then each seed's value in seed
    order (`<key>_by_seed`): "1.5 (1, 2)"; one seed: its value alone; "n/a" for a seed (or, when no seed
    has one, the cell) without the value."""
    mean, by_seed = entry.get(f"{key}_mean"), entry.get(f"{key}_by_seed") or []
    if mean is None:
        return NOT_RECORDED
    if len(by_seed) < 2:
        return fmt(mean, seed_spec)
    values = ", ".join(NOT_RECORDED if value is None else fmt(value, seed_spec) for value in by_seed)
    return f"{fmt(mean, mean_spec)} ({values})"


def stability_row(name: str, entry: dict) -> list[str]:
    """One row of the training-stability table: loss spikes, gradient-norm spikes (counts) and clip rate
    (share of steps), each as the mean over seeds with the per-seed values."""
    specs = {"loss_spikes": (".1f", ".0f"), "grad_spikes": (".1f", ".0f"), "clip_rate": (".1%", ".1%")}
    return [name, *(per_seed_cell(entry, key, *spec) for key, spec in specs.items())]


def _settings_rows(settings) -> list[list[str]]:
    if not isinstance(settings, dict):
        return [["settings", compact(settings)]]
    return [[str(section), ", ".join(f"{k}={compact(v)}" for k, v in values.items())
             if isinstance(values, dict) else compact(values)] for section, values in settings.items()]


# ---------------------------------------------------------------- figures

def _write_figures(results: dict, summary: dict, out_dir: Path) -> list[tuple[str, str, str]]:
    """Draw every figure; returns (relative path, alt text, caption) in report order."""
    from attnres.report import plots  # matplotlib is slow to import: only when a report is written
    from attnres.report.style import series_styles

    fig_dir = out_dir / "figures"
    preset = results.get("preset", "")
    most_seeds = max(len(e["seeds"]) for e in summary.values())
    seeds = len(results.get("seeds") or []) or most_seeds
    routed = {n: e for n, e in summary.items() if e["residual"] != BASELINE}
    styles = series_styles(summary)  # one look per variant, the same in every figure and report
    figures = []

    plots.plot_loss_curves({n: e["val_curve"] for n, e in summary.items()}, fig_dir / "val_loss.png",
                           f"Validation loss ({preset}, {seeds} seed{'s' * (seeds != 1)})", styles)
    band = ("mean over seeds; the shaded band is ± one standard deviation across seeds" if most_seeds > 1 else
            "one seed per variant, so no band: the spread between seeds is not measured here")
    figures.append(("figures/val_loss.png", "validation loss against step",
                    f"Validation loss against training step, {band}. Lower is better."))
    if any(e["step_time_ratio"] is not None for e in routed.values()):
        plots.plot_cost_ratios(
            {n: {"training step": {"ratio": e["step_time_ratio"], "low": e["step_time_low"],
                                   "high": e["step_time_high"], "noisy": e["step_time_noisy"]},
                 "peak memory": {"ratio": e["peak_memory_ratio"]},
                 "activations": {"ratio": e["activation_ratio"]}} for n, e in routed.items()},
            fig_dir / "cost.png", "Cost relative to standard (measured after training, interleaved)", styles)
        noisy = [n for n, e in routed.items() if e["step_time_noisy"]]
        noisy_text = (f" A hatched, pale bar labelled noisy ({', '.join(noisy)}) is one whose interval is too wide "
                      f"to quote." if noisy else "")
        figures.append(("figures/cost.png", "cost ratios",
                        "Training step, peak memory and activation memory of each variant divided by standard's, "
                        "from the Cost section's measurement; the whisker is the step ratio's confidence "
                        f"interval.{noisy_text} Bars right of the dashed line at 1.0 cost more than standard."))
    plots.plot_max_weight_by_depth({n: e["max_weight_by_depth"] for n, e in routed.items()},
                                   fig_dir / "max_weight_by_depth.png", "Routing sharpness by depth", styles)
    figures.append(("figures/max_weight_by_depth.png", "max routing weight by depth",
                    "Token-mean of each router's largest weight, mean over seeds: 1/n means uniform over n "
                    "sources, 1 means one source takes everything. Single-source routers (router 0 sees "
                    "only the embedding) have no point, so the axis starts at the first router with a choice."))
    plots.plot_hidden_rms_by_depth({n: e["hidden_rms_by_depth"] for n, e in summary.items()},
                                   fig_dir / "hidden_rms_by_depth.png", "Hidden-state RMS by depth", styles)
    figures.append(("figures/hidden_rms_by_depth.png", "hidden-state RMS by depth",
                    "RMS of each sub-layer's input h_s and of the final hidden state, mean over seeds; "
                    "a steady rise with depth is the growth that dilutes deep layers' contributions."))

    used: set[str] = set()
    for variant in (v for v in results["variants"] if v["name"] in routed):
        run = min(variant["runs"], key=lambda r: r["seed"])  # the report's reference seed
        stats = run_depth_stats(run)
        if not stats or not stats["source_names"]:
            continue
        name = unique_name(slug(variant["name"], fallback="variant"), used)
        rel = f"figures/routing_{name}.png"
        plots.plot_routing_heatmap(stats["source_names"], stats["mean_weights"], out_dir / rel,
                                   f"Routing weights: {variant['name']} (seed {run['seed']})", plots.mixer_layout(stats))
        columns = plots.heatmap_matrix(stats["source_names"], stats["mean_weights"])[0]
        figures.append((rel, f"routing weights of {variant['name']}",
                        f"{variant['name']}, seed {run['seed']}: mean weight each router (row) gives each "
                        "source (column); blank cells are sources the router cannot see. Sources: "
                        f"{plots.source_key(columns)}."))
    return figures


def _stability_blocks(results: dict, summary: dict) -> list[tuple]:
    """The training-stability section: how events are defined (with the runs' settings: the preset's
    values, else TrainConfig's defaults) and the table."""
    train = (results.get("settings") or {}).get("train")
    train = train if isinstance(train, dict) else {}
    setting = {name: train.get(name, TrainConfig.__dataclass_fields__[name].default) for name in
               ("stability_window", "loss_spike_mads", "loss_spike_floor", "grad_spike_ratio", "grad_clip")}
    window = setting["stability_window"]
    clip = ("the share of steps whose pre-clip gradient norm was above train.grad_clip="
            f"{setting['grad_clip']}" if setting["grad_clip"] is not None else
            "0% throughout: train.grad_clip is null, so no step was clipped")
    text = (f"Events that make runs diverge, counted over every training step (attnres.train.stability, "
            f"docs/how-to/train.md). Loss spike: a step whose training loss is above the median of the previous "
            f"{window} steps' losses by more than max({setting['loss_spike_mads']} × their median absolute "
            f"deviation, {setting['loss_spike_floor']} nats). Grad-norm spike: a pre-clip gradient norm above "
            f"{setting['grad_spike_ratio']} × the previous {window} steps' median. Spikes are looked for from step "
            f"{window + 1} on; each one's step is in its run's metrics.jsonl with an \"event\" list. Clip rate: "
            f"{clip}. Each cell is the mean over seeds, then each seed's value in seed order; "
            f"{NOT_RECORDED}: a run recorded before these events were counted.")
    rows = [stability_row(name, entry) for name, entry in summary.items()]
    return [("h2", "Training stability"), ("p", text), ("table", STABILITY_HEADER, rows, True)]


def _expert_blocks(summary: dict) -> list[tuple]:
    """The expert-balance section of a mixture-of-experts comparison (nothing without experts)."""
    rows = [[name, per_seed_cell(entry, "expert_imbalance", ".2f", ".2f"),
             ", ".join(fmt(value, ".2f") for value in entry.get("expert_imbalance_by_layer") or [])]
            for name, entry in summary.items() if entry.get("expert_imbalance_mean") is not None]
    if not rows:
        return []
    text = ("How evenly each variant's mixture-of-experts layers spread the held-out tokens over their experts at the "
            "end of training: an expert's load is its share of the layer's (token, expert) assignments, and a "
            "layer's imbalance its largest load over the mean (1.00: balanced; the number of experts: one expert "
            "takes every token). Largest imbalance over the layers: the mean over seeds, then each seed's; by "
            "layer: the mean over seeds, shallowest MoE layer first.")
    return [("h2", "Expert balance"), ("p", text),
            ("table", ["variant", "largest imbalance", "imbalance by MoE layer"], rows, True)]


def _machine_text(machine: dict) -> str:
    """"AMD EPYC 7B13 (ATen CPU kernels AVX2, native bf16: no, allocator: libc), 2 torch threads, torch 2.13.0"."""
    kernels = cpu_facts(machine)
    name = machine.get("device_name") or machine.get("device") or "an unnamed device"
    return (name + (f" ({', '.join(kernels)})" if kernels and machine.get("device", "cpu") == "cpu" else "")
            + f", {machine.get('threads', '?')} torch threads, torch {machine.get('torch', '?')}")


def cost_blocks(results: dict, summary: dict) -> list[tuple]:
    """The cost section: what was measured, how, on what, and the table; or why there is none."""
    cost = results.get("cost")
    blocks = [("h2", "Cost")]
    if not cost:
        return blocks + [("p", "These results hold no cost measurement (they were written before `attnres compare` "
                               "measured cost after training). Quote `attnres bench` for costs.")]
    settings = cost["settings"]
    noisy = [n for n, e in summary.items() if e.get("step_time_noisy")]
    threshold = settings["noise_threshold"]
    # the interval's coverage: the same for every variant (one number of rounds)
    coverage = next((e["step_time_coverage"] for e in summary.values() if e.get("step_time_coverage")), None)
    covered = "" if coverage is None else f" (here {coverage:.0%} with {settings['repeats']} rounds)"
    text = (f"Measured {cost.get('created', '-')} in the process that wrote this report, after training, as "
            f"`attnres bench` measures: a fresh model of each variant's configuration (weights from seed "
            f"{settings['seed']}, a random {settings['batch_size']} x {settings['seq_len']} token batch), its "
            "training step (forward with loss, backward, AdamW step) timed in "
            f"{settings['repeats']} rounds after {settings['warmup']} warm-up round(s), every variant once per "
            "round, standard first. Step × standard is the median over rounds of the variant's step divided by "
            "standard's step in the same round; the range is a distribution-free confidence interval of that "
            "median: the k-th lowest to the k-th highest per-round ratio, with the largest k that keeps its "
            f"coverage at 90% or more{covered}. A ratio whose range is wider than "
            f"{threshold:.0%} of it is shown as noisy instead of a number: the machine's load changed while it "
            "was measured, and the interval could not tell a 1.05x cost from a 1.25x one. Routing "
            f"{settings['routing']} (routing_impl={settings['routing_impl']}), precision {settings['precision']}, "
            f"device {settings['device']}: {_machine_text(cost.get('machine') or {})}. Memory: one training "
            "step; activations are the storages saved for backward (exact); peak memory is the CUDA allocator's "
            "peak on a GPU and on a CPU an estimate: weights + gradients + two AdamW moments + activations.")
    blocks.append(("p", text))
    if noisy:
        blocks.append(("p", f"Too noisy to quote here: {', '.join(noisy)} (the interval of the step ratio is wider "
                            f"than {threshold:.0%} of it). Rerun on a quiet machine, or with more rounds, which "
                            "narrow the interval (--set cost.repeats=20), or quote `attnres bench`."))
    rows = [cost_row(name, entry, entry["residual"] == BASELINE) for name, entry in summary.items()]
    return blocks + [("table", COST_HEADER, rows, True)]


# ---------------------------------------------------------------- documents

def _evidence_blocks(results: dict) -> list[tuple]:
    """What the run's seeds can and cannot show, and the headline rule on its own data (results["headline"],
    `attnres.compare.headline.comparison_headline`)."""
    headline = results.get("headline")
    if not headline:
        return []
    loss = "test" if headline["loss"] == "final_test_loss" else "validation"
    protocol = (f"The headline rule (docs/explanation/protocol.md) also needs replications on another corpus and "
                f"architecture and an equal-time arm, which one comparison does not have: it recommends no "
                f"variant from this run. To run the protocol: `{headline['protocol']}` (`attnres compare --preset "
                f"protocol_dense --dry-run` prints its plan).")
    if headline["seeds"] < 2:
        text = (f"**{headline['seeds']} seed per variant.** Each difference to standard above is one draw: it has no "
                f"interval, and no variant is shown better, worse or equivalent. At this size a run's {loss} loss "
                f"moves from seed to seed by about as much as the variants differ, so the ranking above may not "
                f"repeat. ")
    else:
        survives = headline["survives"]
        shown = (", ".join(survives) + (" is" if len(survives) == 1 else " are") + " better than standard"
                 if survives else "no primary variant is shown better than standard")
        text = (f"**{headline['seeds']} seeds per variant.** On {loss} loss, paired by seed with Holm's correction "
                f"over the primary variants (Block AttnRes, hyper-connections, Delta Block), {shown}. ")
    return [("h2", "What these seeds can show"), ("p", text + protocol)]


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
        ablated = [name for name, entry in summary.items()
                   if (options := entry_options(entry)) is not None and not options.fast_paths()]
        note = (f" Variants with router ablations ({', '.join(ablated)}) route with the reference code, "
                f"which the fast paths do not serve (docs/explanation/contenders.md)." if ablated else "")
        blocks.append(("p", f"Code path: routing {code_path['routing']} (routing_impl={code_path['routing_impl']}), "
                            f"precision {code_path['precision']}.{note}"))
    if results.get("rates"):
        blocks.append(("p", f"Each variant trains at its own peak learning rate, the one chosen by the learning-rate "
                            f"search in {results.get('rates_from')} (min_lr keeps its ratio to it): "
                            + "; ".join(f"{name} {rate:.3g}" for name, rate in results["rates"].items()) + "."))
    blocks += [("code", results.get("command", "")),
               ("h2", "Settings"), ("table", ["section", "settings"], _settings_rows(results.get("settings", {})), False),
               ("h2", "Results"),
               ("table", RESULT_HEADER, [result_row(name, entry, entry["residual"] == BASELINE)
                                         for name, entry in summary.items()], True),
               ("p", "Validation loss in nats/token at the end of training, mean ± sample std over seeds; "
                     "perplexity = exp(loss), averaged per seed; its 95% CI is the Student-t interval of that mean over "
                     "seeds (none for one seed). "
                     + ("Train step × and peak memory × come from the cost measurement below (every variant "
                        "interleaved in one process after training), with the confidence interval of the step ratio "
                        "in brackets, or 'noisy' where it is too wide to quote a number. " if results.get("cost") else
                        "Train step × and peak memory × are '-': these results hold no cost measurement. ")
                     + "Max weight: token-mean of the largest routing weight over the deepest third of "
                       "multi-source routers (1 = routing picks one source)."),
               *_evidence_blocks(results),
               *cost_blocks(results, summary),
               ("h2", "Runs"),
               ("table", RUN_HEADER, [[v["name"], str(r["seed"]), fmt(r["final_val_loss"], ".3f"),
                                       fmt(r.get("step_time_s"), ".3f"), fmt(r.get("tokens_per_s"), ",.1f")]
                                      for v in results["variants"] for r in v["runs"]], True),
               ("p", "Training step: the median wall time of each run's training steps (its first few left out); runs "
                     "were made one after another, so these times include whatever else the machine did then and "
                     "are not a cost comparison (the Cost section is)."),
               *_stability_blocks(results, summary),
               *_expert_blocks(summary),
               ("h2", "Figures")]
    return blocks + [("figure", *figure) for figure in figures]


# ---------------------------------------------------------------- files

def write_report(results: dict, out_dir: Path) -> list[Path]:
    """Write results.json, figures/*.png, report.md and index.html into out_dir; returns their paths.

    results: {"preset", "description", "command", "created", "machine": `machine_info`, "code_path":
    {"routing_impl", "routing", "precision"}, "settings": {"model", "data", "train"}, "seeds": [...],
    "variants": [{"name", "residual", the variant's options (flat or under "residual_options"),
    "query_init" (optional), "runs": [{"seed", "run_dir", "val_curve": [[step, loss]], "train_curve", "final_val_loss",
    "step_time_s" (median training-step wall time, informational), "tokens_per_s", "tokens",
    "depth_stats": DepthStats.to_dict(), "stability": `attnres.train.stability.run_totals` (optional:
    without it the stability table shows n/a), "machine" (optional: `machine_info` where it finished)}, ...]},
    ...], "cost": `attnres.compare.cost_measurement.measure_costs`'s
    {"settings": {"repeats", "warmup", "noise_threshold", "seed", "batch_size", "seq_len", "precision",
    "routing_impl", "routing", "device"}, "created", "machine", "variants": {name: {"model",
    "parameters", "train_step_s": {"median_s", "samples_s": one per round}, "memory": {"peak_bytes",
    "activation_bytes", "parameter_bytes", "non_activation_bytes"}}}} (optional: without it the report
    says cost was not measured)}, with exactly one variant whose residual is "standard" (the
    baseline). Required run keys: seed, val_curve, final_val_loss, depth_stats. results.json is the
    input plus "summary" (`summarize`: per variant, the statistics over seeds and the cost figures of
    `cost_summary`) and "figures" (relative paths). Routing heatmaps use each variant's lowest seed.
    """
    summary = summarize(results)  # validates before anything is written
    out_dir = Path(out_dir)
    figures = _write_figures(results, summary, out_dir)
    paths = [path for path, _, _ in figures]
    written = write_document(out_dir, {**results, "summary": summary, "figures": paths},
                             _document(results, summary, figures))
    return written + [out_dir / path for path in paths]
