"""The report of the fair-comparison protocol (`attnres.compare.tune`): the learning-rate search,
the chosen rates and the final runs on the test split, with paired intervals and ties stated."""

from __future__ import annotations

import math
from pathlib import Path

from attnres.analysis.contrasts import setting_tests
from attnres.analysis.intervals import ci95_halfwidth, mean
from attnres.common.atomic import write_atomic
from attnres.report.compare_report import cost_blocks, signed
from attnres.report.compare_summary import cost_summary
from attnres.report.document import dumps_json, fmt, jsonable, render_html, render_markdown

BASELINE = "standard"


def paired_runs(runs: list[dict], reference: list[dict], key: str = "final_test_loss") -> list[float]:
    """Per seed both have, in seed order: this variant's `key` minus the reference's."""
    theirs = {r["seed"]: r[key] for r in reference}
    return [r[key] - theirs[r["seed"]] for r in sorted(runs, key=lambda r: r["seed"]) if r["seed"] in theirs]


def summarize_protocol(results: dict) -> dict[str, dict]:
    """Per variant name (input order): chosen_lr, edge, extended, seeds, test_loss_mean / _ci95,
    val_loss_mean (final runs), delta_vs_standard / _ci95 (test loss minus standard's, paired by seed),
    delta_vs_best / _ci95 (the same against the variant with the lowest mean test loss), best, and tied:
    whether the 95 % interval of the paired difference to the best includes 0 (None without an
    interval); and the cost keys of `cost_summary` (None without a cost measurement). Raises ValueError
    without exactly one standard variant or a run without a test loss."""
    variants = results.get("variants") or []
    baselines = [v for v in variants if v.get("residual") == BASELINE]
    if len(baselines) != 1:
        raise ValueError(f"protocol results need exactly one {BASELINE!r} variant, got "
                         f"{[v.get('residual') for v in variants]}")
    for variant in variants:
        for run in variant["runs"]:
            if not isinstance(run.get("final_test_loss"), (int, float)):
                raise ValueError(f"variant {variant['name']!r}, seed {run.get('seed')}: no final_test_loss")
    best = min(variants, key=lambda v: mean([r["final_test_loss"] for r in v["runs"]]))
    summary = {}
    for variant in variants:
        test = [r["final_test_loss"] for r in variant["runs"]]
        to_base, to_best = paired_runs(variant["runs"], baselines[0]["runs"]), paired_runs(variant["runs"], best["runs"])
        half_best = ci95_halfwidth(to_best)
        summary[variant["name"]] = {
            "residual": variant["residual"], "chosen_lr": variant["chosen_lr"], "edge": variant.get("edge"),
            "extended": variant.get("extended") or [], "seeds": [r["seed"] for r in variant["runs"]],
            "test_loss_mean": mean(test), "test_loss_ci95": ci95_halfwidth(test),
            "val_loss_mean": mean([r["final_val_loss"] for r in variant["runs"]]),
            "delta_vs_standard": mean(to_base), "delta_vs_standard_ci95": ci95_halfwidth(to_base),
            "delta_vs_best": mean(to_best), "delta_vs_best_ci95": half_best,
            "best": variant is best,
            "tied": True if variant is best else (None if half_best is None else abs(mean(to_best)) <= half_best),
            **cost_summary(results.get("cost"), variant["name"], baselines[0]["name"]),
        }
    return summary


def _pm(value, half, spec: str = ".3f", sign: bool = False) -> str:
    text = signed(value) if sign and value is not None else fmt(value, spec)
    return text if half is None else f"{text} ± {half:{spec}}"


def _rate(rate: float) -> str:
    return f"{rate:.3g}"


def search_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """The search as a table: a row per variant, its mean validation loss at every rate (the chosen one
    in bold, "diverged", or "-" where not searched), the chosen rate and a note on extension and edge."""
    rates = sorted({g["lr"] for v in results["variants"] for g in v["grid"]})
    rows = []
    for variant in results["variants"]:
        by_rate = {g["lr"]: g["mean_val_loss"] for g in variant["grid"]}
        cells = []
        for rate in rates:
            loss = by_rate.get(rate)
            text = "-" if loss is None else ("diverged" if not math.isfinite(loss) else f"{loss:.3f}")
            cells.append(f"**{text}**" if rate == variant["chosen_lr"] else text)
        note = []
        if variant.get("extended"):
            note.append("searched beyond the grid at " + ", ".join(_rate(r) for r in variant["extended"]))
        if variant.get("edge"):
            note.append(f"best at the {variant['edge']} edge: the best rate may lie beyond")
        rows.append([variant["name"], *cells, _rate(variant["chosen_lr"]), "; ".join(note) or "-"])
    return ["variant", *(_rate(r) for r in rates), "chosen", "note"], rows


def _result_rows(results: dict, summary: dict) -> list[list[str]]:
    rows = []
    for name, entry in sorted(summary.items(), key=lambda item: item[1]["test_loss_mean"]):
        tied = "best" if entry["best"] else {True: "tied", False: "worse", None: "-"}[entry["tied"]]
        rows.append([name, _rate(entry["chosen_lr"]), str(len(entry["seeds"])),
                     _pm(entry["test_loss_mean"], entry["test_loss_ci95"]),
                     "-" if entry["residual"] == BASELINE else
                     _pm(entry["delta_vs_standard"], entry["delta_vs_standard_ci95"], sign=True),
                     tied, fmt(entry["val_loss_mean"], ".3f")])
    return rows


def ties_sentence(summary: dict) -> str:
    """One sentence naming the best variant and those not distinguishable from it."""
    best = next(name for name, e in summary.items() if e["best"])
    tied = [name for name, e in summary.items() if e["tied"] and not e["best"]]
    if not tied:
        return f"{best} has the lowest test loss, and every other variant is worse by a 95 % interval that excludes 0."
    names = tied[0] if len(tied) == 1 else ", ".join(tied[:-1]) + " and " + tied[-1]
    return (f"{best} has the lowest test loss; {names} {'is' if len(tied) == 1 else 'are'} not "
            f"distinguishable from it (the 95 % interval of the paired difference includes 0).")


def analysis_of(results: dict) -> dict | None:
    """The protocol's tests of a fitted study (`attnres.analysis.contrasts.setting_tests`); None for the 0.2
    protocol, whose final runs reuse the search's seeds."""
    if results["protocol"].get("choice") != "fit":
        return None
    primary = [v["residual"] for v in results["variants"] if v.get("primary", True) and v["residual"] != BASELINE]
    return setting_tests(results, primary)


def p_text(value: float | None) -> str:
    """A p-value as the reports print it: 3 decimals, "< 0.001" below that, "-" for none."""
    return "-" if value is None else "< 0.001" if value < 0.001 else f"{value:.3f}"


def test_header(analysis: dict) -> list[str]:
    return ["variant", "family", "Δ vs standard [95 % CI]", "p", "Holm p", f"TOST p (±{analysis['margin']:g})",
            "verdict", "failed runs [95 % CI]"]


def test_rows(results: dict, analysis: dict) -> list[list[str]]:
    """Per variant: its family, paired difference to standard with interval, p, Holm p, TOST p, verdict and
    failure rate, from `analysis_of`."""
    rows = []
    for variant in results["variants"]:
        residual = variant["residual"]
        failures = analysis["failures"].get(residual) or {}
        low, high = failures.get("interval") or (None, None)
        failed = f"{failures.get('failed', 0)} of {failures.get('runs', 0)}" + (
            "" if low is None else f" [{low:.2f}, {high:.2f}]")
        entry = analysis["contrasts"].get(residual)
        if entry is None:
            rows.append([variant["name"], "baseline" if residual == BASELINE else "-", *["-"] * 5, failed])
            continue
        low_ci, high_ci = entry["ci"]
        rows.append([variant["name"], entry["family"], f"{signed(entry['mean'])} [{low_ci:+.3f}, {high_ci:+.3f}]",
                     p_text(entry["p"]), p_text(entry["holm_p"]), p_text(entry["tost_p"]), entry["verdict"], failed])
    return rows


FIT_HEADER = ["variant", "rate", "95 % interval", "chosen at", "highest stable rate"]


def fit_rows(results: dict) -> list[list[str]]:
    """Per variant: its chosen rate, the fit's interval, whether the vertex or an edge chose it, and its highest
    stable rate."""
    rows = []
    for variant in results["variants"]:
        fit = variant.get("fit") or {}
        interval = "-" if fit.get("low") is None else f"[{_rate(fit['low'])}, {_rate(fit['high'])}]"
        stable = "none" if fit.get("highest_stable") is None else _rate(fit["highest_stable"])
        how = "vertex" if fit.get("vertex_inside") else "edge of the fitted window"
        rows.append([variant["name"], _rate(variant["chosen_lr"]), interval, how, stable])
    return rows


def reading_text(results: dict) -> str:
    """How often a run reads its training split, its tokens per parameter, and what repetition does: the last
    tenth's training loss minus the final validation loss, over every final run (a gap that grows with
    repetition is memorisation)."""
    tokens = results.get("tokens") or {}
    gaps = [r["tail_train_loss"] - r["final_val_loss"] for v in results["variants"] for r in v["runs"]
            if r.get("tail_train_loss") is not None and math.isfinite(r["final_val_loss"])]
    reads = (f"Each run reads {tokens['per_run']:,} tokens of a {tokens['train_split']:,}-token training split "
             f"({tokens['per_run'] / tokens['train_split']:.2f} times). ") if tokens.get("train_split") else ""
    counts = [v["parameters"] for v in results["variants"] if v.get("parameters")]
    if tokens.get("per_run") and counts:  # every parameter counted, embeddings included
        low, high = tokens["per_run"] / max(counts), tokens["per_run"] / min(counts)
        reads += (f"That is {low:.2f} to {high:.2f} tokens per parameter over the variants, every parameter counted. "
                  if f"{low:.2f}" != f"{high:.2f}" else f"That is {low:.2f} tokens per parameter, every one counted. ")
    gap = (f"Training loss over the last tenth of steps minus final validation loss, mean over the final runs: "
           f"{signed(mean(gaps))} nats." if gaps else "")
    return reads + gap


def _document(results: dict, summary: dict, figure: str) -> list[tuple]:
    protocol, settings = results["protocol"], results["settings"]
    machine = results.get("machine") or {}
    machine_text = ", ".join(f"{k} {v}" for k, v in machine.items()) if isinstance(machine, dict) else str(machine)
    header, searched = search_rows(results)
    data = settings.get("data", {})
    analysis = analysis_of(results)
    choice = (
        f"Its rate is the vertex of a quadratic in log2(rate) fitted to the runs of the five stable rates "
        f"around a first fit's vertex; a run has failed when its loss is not finite or above "
        f"{protocol.get('failure_threshold', math.inf):.3f} nats (the training split's unigram entropy), and a "
        f"choice on the edge extends the search one grid step, at most {protocol['max_extensions']} times. At "
        f"its rate each variant trains fresh seeds from {protocol.get('final_seed_start')}, none of them a "
        f"search seed" if analysis is not None else
        f"Its rate is the one with the lowest mean validation loss; a best rate on the edge of those searched "
        f"extends the search one grid step further, at most {protocol['max_extensions']} times. At its rate "
        f"each variant trains {protocol['final_seeds']} seeds (the search's seeds at that rate among them)")
    tests = [] if analysis is None else [
        ("p", reading_text(results)),
        ("h2", "Fitted rates"),
        ("table", FIT_HEADER, fit_rows(results), True),
        ("h2", "Tests"),
        ("table", test_header(analysis), test_rows(results, analysis), True),
        ("p", "Paired t tests of test loss against standard on the same seed; Holm's correction within each "
              "family; 'equivalent' only where two one-sided tests reject a difference as large as the margin; a "
              "failed run counts at the failure threshold; failure rates with Clopper-Pearson intervals. "
              + ("" if analysis["best"] is None else
                 f"Best-test among the primary variants and standard: {analysis['best']['candidate']} "
                 f"{'is' if analysis['best']['shown_best'] else 'is not'} shown better than each other one.")),
    ]
    return [
        ("h1", f"attnres comparison: {results.get('preset', '')} (fair-comparison protocol)"),
        ("p", str(results.get("description") or "")),
        ("p", f"Created {results.get('created', '-')} on {machine_text or '-'}."),
        ("code", results.get("command", "")),
        ("h2", "Protocol"),
        ("p", f"Every variant is trained at each peak learning rate of {', '.join(_rate(r) for r in protocol['lr_grid'])} "
              f"with {protocol['grid_seeds']} seeds (min_lr = {settings['min_lr_ratio']:g} × the rate, every other "
              f"setting the same). {choice}, and is reported on the test split: {data.get('test_fraction')} of the "
              f"documents, held out by document like validation ({data.get('val_fraction')}); no choice reads it."),
        ("h2", "Learning-rate search"),
        ("table", header, searched, True),
        ("p", f"Mean validation loss over {protocol['grid_seeds']} seeds at each rate; "
              + ("the chosen rate's in bold. " if analysis is None else
                 "'chosen': the fitted rate, which need not be one of them (Fitted rates, below). ")
              + "'diverged': a seed's loss was not finite."),
        ("figure", figure, "validation loss against learning rate",
         "Mean validation loss against peak learning rate, one line per variant; the circle marks its chosen rate."),
        *tests,
        ("h2", "Results on the test split"),
        ("table", ["variant", "lr", "seeds", "test loss", "Δ vs standard", "vs best", "val loss"],
         _result_rows(results, summary), True),
        ("p", "Test loss in nats/token at the end of training: mean ± the half-width of its 95 % Student-t interval "
              "over seeds. Δ vs standard: the difference paired by seed, mean ± 95 % half-width. 'tied': the paired "
              "difference to the best variant has a 95 % interval that includes 0. Val loss: the final runs' mean "
              "validation loss, the split the rates were chosen on. "
              + (ties_sentence(summary) if analysis is None else "'vs best' is uncorrected: the Tests above say "
                 "what is shown.")),
        *cost_blocks(results, summary),
        ("h2", "Runs"),
        ("table", ["variant", "lr", "seed", "val loss", "test loss"],
         [[v["name"], _rate(r["lr"]), str(r["seed"]), f"{r['final_val_loss']:.4f}", f"{r['final_test_loss']:.4f}"]
          for v in results["variants"] for r in v["runs"]], True),
    ]


def write_protocol_report(results: dict, out_dir: Path) -> list[Path]:
    """Write results.json (results plus "summary"), figures/lr_search.png, report.md and index.html.

    results: `attnres.compare.tune.protocol_results`'s {"preset", "description", "command", "created",
    "machine", "protocol": {"lr_grid", "grid_seeds", "max_extensions", "final_seeds"}, "settings":
    {"model", "data", "train", "min_lr_ratio"}, "variants": [{"name", "residual", options, "grid":
    [{"lr", "mean_val_loss", "val_losses"}], "chosen_lr", "edge", "extended", "runs": [compare's run
    record with "final_test_loss" and "lr"]}], "cost": `measure_costs`'s measurement}.
    """
    from attnres.report import plots  # matplotlib is slow to import: only when a report is written
    from attnres.report.style import series_styles

    summary = summarize_protocol(results)  # validates before anything is written
    out_dir = Path(out_dir)
    figure = "figures/lr_search.png"
    plots.plot_rate_search({v["name"]: [(g["lr"], g["mean_val_loss"]) for g in v["grid"]] for v in results["variants"]},
                           {v["name"]: v["chosen_lr"] for v in results["variants"]}, out_dir / figure,
                           f"Learning-rate search ({results.get('preset', '')})",
                           series_styles({v["name"]: v for v in results["variants"]}))
    blocks = _document(results, summary, figure)
    analysis = analysis_of(results)
    extra = {"summary": summary, **({"analysis": analysis} if analysis is not None else {})}
    return [write_atomic(out_dir / "results.json", dumps_json(jsonable({**results, **extra})) + "\n"),
            write_atomic(out_dir / "report.md", render_markdown(blocks)),
            write_atomic(out_dir / "index.html", render_html(blocks)), out_dir / figure]
