"""The report of `attnres scaling`: results.json, report.md, index.html and three figures.

`results` is the sweep's output with its fit summary under "fit" (`attnres.scaling.summary.
summarize_sweep`); this module only renders it, since the report layer sits below `attnres.scaling`.
As in the comparison report, report.md and index.html come from one list of blocks
(`attnres.report.document`), and every number they print is in results.json: the input, plus the
tables derived here from the runs (final losses over seeds, FLOPs against standard's, divergence
totals) under "tables", and the figure list under "figures".
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from attnres.report.compare_summary import BASELINE, cost_summary
from attnres.report.document import compact, fmt, plus_minus, write_document

LAWS = ("saturating", "power")  # attnres.scaling.fit.LAWS, which this layer cannot import
LAW_FORMULA = {"saturating": "L = A C^-alpha + E", "power": "L = A C^-alpha"}
FLOOR = "beyond standard's floor"  # how an infinite advantage (None in results.json) reads
STABILITY_KEYS = ("loss_spikes", "grad_spikes", "clipped_steps", "steps")  # of `run_totals`
BAND_ALPHA = 0.15
ADVANTAGE_TOP = 100.0  # the advantage figure's y axis ends here, unless a whole curve lies above it


# ---------------------------------------------------------------- checks and derived tables

def _check(results: dict) -> dict:
    """The baseline variant, after checking the keys the report reads; ValueError naming what is missing."""
    for key in ("variants", "fit"):
        if not results.get(key):
            raise ValueError(f"scaling results lack {key!r}")
    for variant in results["variants"]:
        for key in ("name", "residual", "runs"):
            if key not in variant:
                raise ValueError(f"variant {variant.get('name', '?')!r} lacks {key!r}")
        for run in variant["runs"]:
            for key in ("size", "seed", "parameters", "flops", "final_val_loss"):
                if key not in run:
                    raise ValueError(f"a run of {variant['name']!r} lacks {key!r}")
    baselines = [v for v in results["variants"] if v["residual"] == BASELINE]
    if len(baselines) != 1:
        raise ValueError(f"scaling results need exactly one variant with residual {BASELINE!r}, got "
                         f"{[v['residual'] for v in results['variants']]}")
    if results["fit"].get("baseline") != baselines[0]["name"]:
        raise ValueError(f"the fit's baseline {results['fit'].get('baseline')!r} is not the standard variant "
                         f"{baselines[0]['name']!r}: the fit is of other variants")
    return baselines[0]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def final_losses(variants: list[dict]) -> dict:
    """{variant: {size: {"mean", "std" (sample, None for one seed), "seeds"}}} of final validation loss
    over the seeds with a finite loss; sizes in run order."""
    out = {}
    for v in variants:
        by_size: dict[str, list[float]] = {}
        for run in v["runs"]:
            by_size.setdefault(run["size"], [])
            if _finite(run["final_val_loss"]):
                by_size[run["size"]].append(run["final_val_loss"])
        out[v["name"]] = {size: {"mean": statistics.fmean(xs) if xs else None,
                                 "std": statistics.stdev(xs) if len(xs) > 1 else None, "seeds": len(xs)}
                          for size, xs in by_size.items()}
    return out


def flops_by_size(variants: list[dict]) -> dict:
    """{variant: {size: training FLOPs of a run of that size}} (every seed trains the same FLOPs)."""
    return {v["name"]: {run["size"]: run["flops"] for run in v["runs"]} for v in variants}


def flops_vs_standard(variants: list[dict], baseline: str) -> dict:
    """{variant: [lowest, highest] ratio of its FLOPs to standard's at the same size} (non-standard)."""
    flops = flops_by_size(variants)
    base = flops.pop(baseline)
    ratios = {name: [c / base[s] for s, c in sizes.items() if base.get(s)] for name, sizes in flops.items()}
    return {name: [min(r), max(r)] for name, r in ratios.items() if r}


def stability_totals(variants: list[dict]) -> dict:
    """{variant: {"runs", "recorded" (runs with a `stability` dict), "loss_spikes", "grad_spikes",
    "clipped_steps", "steps" (sums over the recorded runs; None when none is recorded)}}."""
    out = {}
    for v in variants:
        recorded = [run["stability"] for run in v["runs"] if isinstance(run.get("stability"), dict)]
        sums = {key: (sum(s.get(key) or 0 for s in recorded) if recorded else None) for key in STABILITY_KEYS}
        out[v["name"]] = {"runs": len(v["runs"]), "recorded": len(recorded), **sums}
    return out


def derived_tables(results: dict, baseline: str) -> dict:
    """What the report computes from the runs, saved in results.json beside them."""
    variants = results["variants"]
    return {"final_losses": final_losses(variants), "flops": flops_by_size(variants),
            "flops_vs_standard": flops_vs_standard(variants, baseline), "stability": stability_totals(variants)}


# ---------------------------------------------------------------- numbers as text

def times(value) -> str:
    """An advantage as printed: "1.31×"; None (infinite in the fit) is beyond standard's floor."""
    return FLOOR if value is None else f"{value:.2f}×" if value < 100 else f"{value:.3g}×"


def _flops(value) -> str:
    return fmt(value, ".2e")


def _confidence(fit: dict) -> str:
    return f"{fit['settings']['confidence']:.0%}"


def quoted_law(fit: dict, name: str) -> tuple[str | None, list[str]]:
    """The law whose advantage the report quotes for `name`, and why it is not the saturating one:
    saturating unless `name`'s or standard's saturating fit was refused, flagged (residuals beyond
    the seed spread) or without an interval (as many runs as parameters); then power, if that advantage could be computed; None when neither."""
    laws, factor, reasons = fit["laws"]["saturating"], fit["settings"]["misfit_factor"], []
    for who in (name, fit["baseline"]):
        entry = laws[who]
        if entry["fit"] is None:
            reasons.append(f"the saturating fit of {who} was refused ({entry['error']})")
        elif entry.get("no_interval"):
            reasons.append(f"the saturating fit of {who} has no interval: {entry['no_interval']}")
        elif entry["misfit"]:
            reasons.append(f"the saturating fit of {who} is flagged: its RMS log residual, "
                           f"{entry['fit']['rms_log_residual']:.4f}, is more than {factor:g}× the seed spread, "
                           f"{entry['seed_spread']:.4f}, so the law misses the points by more than the noise")
    if not reasons:
        return "saturating", []
    return ("power" if fit["advantage"]["power"][name]["error"] is None else None), reasons


def interval_side(entry: dict) -> str | None:
    """Where the advantage's interval at C_max lies: "ahead" (above 1), "behind" (below 1), "contains"
    (1 inside it), or None without replicates. Inside a computed entry a None end is infinite
    (beyond standard's floor)."""
    low, high = entry["at_max"]["low"], entry["at_max"]["high"]
    if not entry["replicates"]:
        return None
    if low is None or low > 1:
        return "ahead"
    return "behind" if high is not None and high < 1 else "contains"


def interval_verdict(entry: dict, name: str) -> str:
    """Whether the advantage's interval excludes 1, in words."""
    if interval_side(entry) is None and entry.get("no_interval"):
        return f"There is no interval: {entry['no_interval']}."
    return {None: "No bootstrap replicate could be fitted, so there is no interval.",
            "ahead": f"The interval excludes 1: {name} needs less compute than standard for the same loss.",
            "behind": f"The interval excludes 1: {name} needs more compute than standard for the same loss.",
            "contains": f"The interval contains 1: this sweep does not show that {name} differs from standard at "
                        "this compute."}[interval_side(entry)]


def advantage_text(entry: dict, confidence: str) -> str:
    """"1.31× (95% interval 1.18× to 1.45×)", with "beyond standard's floor" for an infinite end."""
    at, n = entry["at_max"], entry["replicates"]
    if at["value"] is None:  # infinite: an interval "from beyond to beyond" says nothing more
        share = "" if not n else f"; so is it in {at['beyond_floor_share']:.0%} of the {n} bootstrap replicates"
        return f"{FLOOR} (its fitted loss is below standard's fitted floor E{share})"
    if not n:
        return times(at["value"])
    return f"{times(at['value'])} ({confidence} interval {times(at['low'])} to {times(at['high'])})"


def conclusion(results: dict) -> list[str]:
    """The conclusion's paragraphs: per non-standard variant, its compute advantage at the largest
    compute under the quoted law with its interval and whether that excludes 1."""
    fit = results["fit"]
    c_max, confidence = fit["compute_range"][1], _confidence(fit)
    out = []
    for variant in results["variants"]:
        name = variant["name"]
        if name == fit["baseline"]:
            continue
        law, reasons = quoted_law(fit, name)
        lead = f"{name}: " + ("; ".join(reasons) + ". " if reasons else "")
        if law is None:
            out.append(lead + "No compute advantage can be given: the power law too has "
                       f"{fit['advantage']['power'][name]['error']}.")
            continue
        entry = fit["advantage"][law][name]
        fallback = ""
        if law == "power":
            flagged = fit["advantage"]["saturating"][name]
            fallback = (f" (the saturating fit gives {times(flagged['at_max']['value'])})"
                        if flagged["error"] is None else "")
            lead += "The power law's figure instead: "
            missed = [who for who in (name, fit["baseline"]) if fit["laws"]["power"][who]["misfit"]]
            if missed:
                fallback += (f"; the power law too misses the points of {' and '.join(missed)} by more than "
                             f"{fit['settings']['misfit_factor']:g}× the seed spread, so this figure is rough")
        out.append(lead + f"at the sweep's largest compute, {_flops(c_max)} FLOPs, its compute advantage over "
                   f"standard is {advantage_text(entry, confidence)} under the {law} law{fallback}. "
                   f"{interval_verdict(entry, name)}")
    return out


# ---------------------------------------------------------------- tables

SIZE_HEADER = ["size", "width", "layers", "heads", "kv heads", "FFN", "parameters", "total parameters", "tokens",
               "epochs", "steps", "FLOPs (standard)", "seeds"]


def size_rows(results: dict, tables: dict, baseline: str) -> list[list[str]]:
    """One row per size of the grid; parameters are standard's non-embedding ones; epochs: passes over
    the training split (tokens / its length; "-" when the sweep did not record it)."""
    flops = tables["flops"][baseline]
    return [[s["name"], *(str(s.get(k, "-")) for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                                       "intermediate_size")),
             fmt(s.get("parameters"), ","), fmt(s.get("total_parameters"), ","), fmt(s.get("tokens"), ","),
             fmt(s.get("epochs"), ".2f"), fmt(s.get("steps"), ","), _flops(flops.get(s["name"])), ", ".join(map(str, s.get("seeds", [])))]
            for s in results.get("sizes") or []]


def fit_header(law: str) -> list[str]:
    e = ["E [CI]"] if law == "saturating" else []
    return ["variant", "runs", "A", "alpha [CI]", *e, "loss at C_max [CI]", "RMS log residual", "seed spread", "flag"]


def _with_interval(value, pair, spec: str) -> str:
    """"0.147 [0.143, 0.151]": a fitted value and its bootstrap interval; "-" without a fit."""
    if value is None or not pair or pair[0] is None:
        return fmt(value, spec)
    return f"{fmt(value, spec)} [{fmt(pair[0], spec)}, {fmt(pair[1], spec)}]"


def fit_row(law: str, name: str, entry: dict) -> list[str]:
    """One variant's fit under `law` as the fit table prints it ("-" where the fit was refused)."""
    f, at = entry["fit"] or {}, entry["loss_at_max"] or {}
    e = [_with_interval(f.get("e"), entry["e"], ".3g")] if law == "saturating" else []
    return [name, str(entry["points"]), fmt(f.get("a"), ".3g"),
            _with_interval(f.get("alpha"), entry["alpha"], ".3g"), *e,
            _with_interval(at.get("value"), [at.get("low"), at.get("high")], ".3f"),
            fmt(f.get("rms_log_residual"), ".4f"), fmt(entry["seed_spread"], ".4f"),
            "refused" if entry["fit"] is None else {True: "misfit", False: "ok", None: "-"}[entry["misfit"]]]


ADVANTAGE_HEADER = ["variant", "law", "at C_max", "CI", "interval excludes 1", "range over the sweep"]


def advantage_row(law: str, name: str, entry: dict) -> list[str]:
    """One row of the advantage table: at C_max, its interval, which side of 1, the range over the sweep."""
    if entry["error"] is not None:
        return [name, law, "-", entry["error"], "-", "-"]
    at, (low, high) = entry["at_max"], entry["range"] or [None, None]
    excludes = {None: "-", "contains": "no", "ahead": "yes, ahead", "behind": "yes, behind"}[interval_side(entry)]
    ci = f"{times(at['low'])} to {times(at['high'])}" if entry["replicates"] else "-"
    return [name, law, times(at["value"]), ci, excludes, f"{times(low)} to {times(high)}"]


def loss_cell(stats: dict | None) -> str:
    return plus_minus(stats["mean"], stats["std"], ".3f") if stats else "-"


STABILITY_HEADER = ["variant", "runs recorded", "loss spikes", "grad-norm spikes", "clipped steps", "steps"]


def stability_row(name: str, totals: dict) -> list[str]:
    cells = [fmt(totals[key], ",") if totals["recorded"] else "n/a" for key in STABILITY_KEYS]
    return [name, f"{totals['recorded']} of {totals['runs']}", *cells]


# ---------------------------------------------------------------- figures

def variant_styles(variants: list[dict]) -> dict[str, dict]:
    """name -> matplotlib keywords: each variant's one look (`attnres.report.style.style_of`, kept apart
    by `series_styles`), the same as in every other report."""
    from attnres.report.style import series_styles

    return series_styles({v["name"]: v for v in variants})


def _nan(values) -> list[float]:
    return [math.nan if v is None else v for v in values]


def _band(ax, band: dict, style: dict, value_key: str) -> None:
    """The fitted curve and its shaded interval; None points (infinite) leave gaps."""
    line = {k: style[k] for k in ("color", "linestyle")}
    ax.plot(band["compute"], _nan(band[value_key]), linewidth=1.8, **line)
    ax.fill_between(band["compute"], _nan(band["low"]), _nan(band["high"]), color=style["color"],
                    alpha=BAND_ALPHA, linewidth=0)


def _proxy(ax, name: str, style: dict) -> None:
    """An empty line in the variant's full style: the legend shows its line and marker."""
    from attnres.report.plots import MARKER_SIZE

    ax.plot([], [], label=name, markersize=MARKER_SIZE, **style)


def _points(ax, xs, ys, style: dict, size: float) -> None:
    pts = [(x, y) for x, y in zip(xs, ys) if _finite(x) and _finite(y) and x > 0 and y > 0]
    if pts:
        ax.plot(*zip(*pts), linestyle="none", marker=style["marker"], color=style["color"],
                markerfacecolor=style["markerfacecolor"], markersize=size, alpha=0.85)


def _plain_log_ticks(axis) -> None:
    """Plain numbers on a log axis that spans less than a decade (else it shows no label at all)."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)))
    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(NullFormatter())


def draw_loss_vs_compute(ax, results: dict, styles: dict) -> dict[str, str | None]:
    """Every run as a point and each variant's fitted curve with its band; returns name -> law drawn."""
    fit, drawn = results["fit"], {}
    for v in results["variants"]:
        name, style = v["name"], styles[v["name"]]
        _points(ax, [r["flops"] for r in v["runs"]], [r["final_val_loss"] for r in v["runs"]], style, 5)
        # saturating, or power where that fit has no curve
        law = drawn[name] = next((law for law in LAWS if fit["laws"][law][name]["band"]), None)
        if law:
            _band(ax, fit["laws"][law][name]["band"], style, "loss")
        _proxy(ax, name + (" (power law)" if law == "power" else ""), style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set(xlabel="training compute (FLOPs)", ylabel="final validation loss (nats/token)")
    return drawn


def draw_compute_advantage(ax, results: dict, styles: dict) -> dict[str, str | None]:
    """Each non-standard variant's advantage curve (the law the conclusion quotes) with its band and a
    dashed line at 1; returns name -> law drawn."""
    from attnres.report import plots

    fit, drawn = results["fit"], {}
    for v in results["variants"]:
        name = v["name"]
        if name == fit["baseline"]:
            continue
        law = drawn[name] = quoted_law(fit, name)[0]
        if law:
            _band(ax, fit["advantage"][law][name]["curve"], styles[name], "value")
            _proxy(ax, name + (" (power law)" if law == "power" else ""), styles[name])
    ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1)
    curves = [[y for y in fit["advantage"][law][n]["curve"]["value"] if y is not None]
              for n, law in drawn.items() if law]
    values = [y for curve in curves for y in curve]
    plots.log_scale_if_wide(ax, values + [1.0])  # near standard's floor the advantage grows without bound
    if max(values, default=1.0) > ADVANTAGE_TOP and all(min(c) <= ADVANTAGE_TOP for c in curves if c):
        ax.set_ylim(top=ADVANTAGE_TOP)  # the variants near 1 stay apart; every curve still shows
    ax.set_xscale("log")
    ax.set(xlabel="training compute (FLOPs)", ylabel="compute advantage over standard (×)")
    return drawn


def draw_loss_vs_parameters(ax, results: dict, styles: dict) -> int:
    """Mean final loss per size against non-embedding parameters, a line per variant, each seed a
    small point; returns the number of variants drawn."""
    drawn = 0
    for v in results["variants"]:
        style, by_size = styles[v["name"]], {}
        for run in v["runs"]:
            by_size.setdefault(run["size"], (run["parameters"], []))[1].append(run["final_val_loss"])
        means = sorted((p, statistics.fmean([y for y in ys if _finite(y)])) for p, ys in by_size.values()
                       if p and any(_finite(y) for y in ys))
        _points(ax, [r["parameters"] for r in v["runs"]], [r["final_val_loss"] for r in v["runs"]], style, 3)
        if means:
            ax.plot(*zip(*means), label=v["name"], markersize=6, **style)
            drawn += 1
    ax.set_xscale("log")
    ax.set(xlabel="non-embedding parameters", ylabel="final validation loss (nats/token)")
    return drawn


def _figure(path: Path, title: str, variants: int, draw) -> object:
    """A one-axes report figure: `draw(ax)` fills it (returning what it drew), legend below, saved."""
    import matplotlib

    from attnres.report import plots

    with matplotlib.rc_context(plots.STYLE):
        fig, (ax,) = plots.new_figure(4.8 + 0.3 * math.ceil(variants / 2))
        drawn = draw(ax)
        handles, labels = ax.get_legend_handles_labels()
        if not labels:
            plots.empty_note(ax, "nothing to draw")
        ax.set_title(plots.wrapped(title))
        if labels:  # below the axes (covers no data); named even when one, the title names no variant
            fig.legend(handles, labels, loc="outside lower center", ncols=min(2, len(labels)), frameon=False)
        plots.save_figure(fig, path)
    return drawn


def _law_caption(drawn: dict[str, str | None], why: str) -> str:
    """Which variants' curves are the power law instead (`why`), and which have none."""
    power = [n for n, law in drawn.items() if law == "power"]
    none = [n for n, law in drawn.items() if law is None]
    text = ("" if not power else f" The curves of {', '.join(power)} are the power law {LAW_FORMULA['power']} "
            f"(marked '(power law)' in the legend): {why}.")
    return text + (f" No curve for {', '.join(none)}: no fit could be made." if none else "")


FALLBACK_WHY = ("the saturating fit of the variant or of standard was refused or flagged, as the Conclusion "
                "says")


def write_figures(results: dict, out_dir: Path) -> list[tuple[str, str, str]]:
    """Draw the three figures; returns (relative path, alt text, caption) in report order."""
    styles = variant_styles(results["variants"])
    n, fig_dir, confidence = len(results["variants"]), out_dir / "figures", _confidence(results["fit"])
    laws = _figure(fig_dir / "loss_vs_compute.png", "Final validation loss against training compute", n,
                   lambda ax: draw_loss_vs_compute(ax, results, styles))
    figures = [("figures/loss_vs_compute.png", "loss against compute",
                f"Final validation loss against training FLOPs, log-log: every run (every seed) is a point; each "
                f"variant's curve is its saturating law {LAW_FORMULA['saturating']} with the {confidence} "
                f"bootstrap band shaded.{_law_caption(laws, 'their saturating fit was refused')}")]
    laws = _figure(fig_dir / "compute_advantage.png", "Compute advantage over standard", n - 1,
                   lambda ax: draw_compute_advantage(ax, results, styles))
    figures.append(("figures/compute_advantage.png", "compute advantage against compute",
                    "The compute standard needs to reach each variant's fitted loss, divided by the variant's "
                    f"compute, across the sweep's compute (saturating law), with its {confidence} paired-bootstrap "
                    "band. Above the dashed line at 1 the variant is ahead of standard. A gap in a curve or band "
                    f"is a loss below standard's fitted floor E ({FLOOR}); a curve that runs past "
                    f"{ADVANTAGE_TOP:g}× leaves the axis at the top, unless a curve lies wholly above it."
                    f"{_law_caption(laws, FALLBACK_WHY)}"))
    _figure(fig_dir / "loss_vs_parameters.png", "Final validation loss against model size", n,
            lambda ax: draw_loss_vs_parameters(ax, results, styles))
    figures.append(("figures/loss_vs_parameters.png", "loss against parameters",
                    "Final validation loss against each variant's non-embedding parameters (log x): the line "
                    "joins the means over seeds per size, the small points are the seeds."))
    return figures


# ---------------------------------------------------------------- document

def size_names(results: dict) -> list[str]:
    """The sizes of the grid in order: from "sizes", else as the runs first name them."""
    return [s["name"] for s in results.get("sizes") or []] or list(
        dict.fromkeys(r["size"] for v in results["variants"] for r in v["runs"]))


def _summary_text(results: dict) -> str:
    fit, variants = results["fit"], results["variants"]
    settings, (c_min, c_max) = fit["settings"], fit["compute_range"]
    runs = sum(len(v["runs"]) for v in variants)
    sizes = size_names(results)
    seeds = sorted({r["seed"] for v in variants for r in v["runs"]})
    return (f"{len(variants)} residual variants ({', '.join(v['name'] for v in variants)}) trained at "
            f"{len(sizes)} model sizes with seeds {', '.join(map(str, seeds))}: {runs} runs from {_flops(c_min)} to "
            f"{_flops(c_max)} training FLOPs. Per variant, final validation loss against training compute C is "
            f"fitted with a saturating law, {LAW_FORMULA['saturating']} (E the irreducible loss), and a plain power "
            f"law, {LAW_FORMULA['power']}, by {settings['robust_loss']}. Intervals are {_confidence(fit)} percentile "
            f"intervals over {settings['replicates']} bootstrap replicates ({settings['bootstrap']} method, seed "
            f"{settings['seed']}), paired across variants. The compute advantage of a variant is the compute "
            "standard needs to reach the loss the variant reaches, divided by the variant's compute: above 1, the "
            "variant is ahead.")


def _fit_blocks(fit: dict, law: str) -> list[tuple]:
    entries = fit["laws"][law]
    notes = [f"{name}: {e['error']}" for name, e in entries.items() if e["error"]]
    notes += [f"{name}: {e['excluded']} run(s) without a finite loss left out" for name, e in entries.items()
              if e.get("excluded")]
    text = (f"{LAW_FORMULA[law]}, C in FLOPs. Runs: how many were fitted. CI: {_confidence(fit)} bootstrap "
            "interval. Loss at C_max: the fitted loss at the sweep's largest compute. Seed spread: the pooled standard "
            "deviation of log loss between seeds of a size; flag 'misfit' when the RMS log residual is more than "
            f"{fit['settings']['misfit_factor']:g}× it, '-' when no size has two seeds to measure it.")
    blocks = [("h2", f"Fit: {law} law"), ("p", text),
              ("table", fit_header(law), [fit_row(law, name, e) for name, e in entries.items()], True)]
    return blocks + ([("p", "Refused or reduced: " + "; ".join(notes) + ".")] if notes else [])


def _stability_blocks(tables: dict) -> list[tuple]:
    totals = tables["stability"]
    blocks = [("h2", "Divergence events")]
    if not any(t["recorded"] for t in totals.values()):
        return blocks + [("p", "No run recorded divergence events (loss spikes, gradient-norm spikes, clipping).")]
    return blocks + [("p", "Totals over each variant's runs that recorded them (attnres.train.stability, "
                           "docs/how-to/train.md); n/a: no run of the variant recorded them."),
                     ("table", STABILITY_HEADER, [stability_row(n, t) for n, t in totals.items()], True)]


def _size_blocks(results: dict, tables: dict, baseline: str) -> list[tuple]:
    blocks = [("h2", "Rules"),
              ("table", ["rule", "value"], [[str(k), compact(v)] for k, v in (results.get("rules") or {}).items()],
               False),
              ("h2", "Sizes"), ("table", SIZE_HEADER, size_rows(results, tables, baseline), True)]
    ratios = tables["flops_vs_standard"]
    if ratios:
        parts = [f"{name} {lo:.3f}×" + ("" if math.isclose(lo, hi, rel_tol=5e-4) else f" to {hi:.3f}×")
                 for name, (lo, hi) in ratios.items()]
        blocks.append(("p", "Parameters: standard's non-embedding weights. Training FLOPs of the other variants "
                            "relative to standard's at the same size (attnres.model.flops): " + ", ".join(parts) + "."))
    return blocks


COST_HEADER = ["variant", "training step × standard [interval]", "FLOPs × standard", "FLOPs per second × standard",
               "compute advantage at C_max (saturating)", "in wall-clock time"]


def wall_clock_advantage(results: dict) -> dict[str, dict]:
    """Per variant at the largest size: the measured step-time ratio with its interval ("step", "step_low",
    "step_high"), the FLOPs ratio, the FLOPs per second relative to standard's ("speed": FLOPs ratio /
    step-time ratio), the saturating law's advantage entry at C_max ("entry", None where refused), and
    that advantage turned into time ("value", "low", "high": advantage x speed; None where the advantage
    or its interval has no finite value). The interval is the advantage's, scaled by the same factor (the
    step ratio's own interval is reported beside it)."""
    cost, fit, size = results["cost"], results["fit"], results["cost_size"]
    flops = {name: by_size[size] for name, by_size in flops_by_size(results["variants"]).items()}
    out = {}
    for name in cost["variants"]:
        if name == fit["baseline"]:
            continue
        timing = cost_summary(cost, name, fit["baseline"])
        step, flops_ratio = timing["step_time_ratio"], flops[name] / flops[fit["baseline"]]
        speed = flops_ratio / step
        entry = fit["advantage"]["saturating"].get(name) or {}
        at = entry.get("at_max") if entry.get("error") is None else None
        scaled = lambda x: None if x is None else x * speed  # noqa: E731
        out[name] = {"step": step, "step_low": timing["step_time_low"], "step_high": timing["step_time_high"],
                     "flops_ratio": flops_ratio, "speed": speed, "entry": entry if at else None,
                     "value": scaled(at["value"]) if at else None,
                     "low": scaled(at["low"]) if at and entry["replicates"] else None,
                     "high": scaled(at["high"]) if at and entry["replicates"] else None}
    return out


def wall_clock_rows(results: dict) -> list[list[str]]:
    """The rows of the wall-clock table: `wall_clock_advantage`'s numbers, as the report prints them."""
    rows = []
    for name, w in wall_clock_advantage(results).items():
        advantage = "-" if w["entry"] is None else advantage_text(w["entry"], _confidence(results["fit"]))
        in_time = "-" if w["value"] is None else times(w["value"])
        if w["value"] is not None and w["low"] is not None and w["high"] is not None:
            in_time += f" ({times(w['low'])} to {times(w['high'])})"
        rows.append([name, f"{w['step']:.2f}× [{w['step_low']:.2f}, {w['step_high']:.2f}]",
                     f"{w['flops_ratio']:.3f}×", f"{w['speed']:.2f}×", advantage, in_time])
    return rows


def _cost_blocks(results: dict) -> list[tuple]:
    if not results.get("cost"):
        return []
    cost = results["cost"]
    settings = cost["settings"]
    coverage = cost_summary(cost, next(iter(cost["variants"])), results["fit"]["baseline"])["step_time_coverage"]
    text = (f"The fit charges FLOPs; time is another matter. Measured after training, in this process: a fresh "
            f"model of every variant at the largest size ({results['cost_size']}), one training step each per round, "
            f"interleaved, {settings['repeats']} rounds after {settings['warmup']} warm-up, batch "
            f"{settings['batch_size']} x {settings['seq_len']}, {settings['precision']}, routing "
            f"{settings['routing']}: the median over rounds of the step time over standard's in the same round, with "
            f"its distribution-free interval ({fmt(coverage, '.0%')} coverage). The compute advantage in wall-clock time is the advantage at C_max times "
            f"the variant's FLOPs per second relative to standard's (FLOPs ratio / step-time ratio): below the FLOPs "
            f"advantage where routing runs slower than its FLOPs suggest.")
    return [("h2", "Measured step time and the advantage in wall-clock time"), ("p", text),
            ("table", COST_HEADER, wall_clock_rows(results), True)]


def _machine_blocks(results: dict) -> list[tuple]:
    machine = results.get("machine") or {}
    text = ", ".join(f"{k} {v}" for k, v in machine.items()) if isinstance(machine, dict) else str(machine)
    blocks = [("h2", "Command and machine"), ("code", results.get("command", "")),
              ("p", f"Created {results.get('created', '-')} on {text or '-'}.")]
    estimate = results.get("gpu_estimate")
    if isinstance(estimate, dict):
        blocks += [("p", "GPU estimate:"),
                   ("table", ["item", "value"], [[str(k), compact(v)] for k, v in estimate.items()], False)]
    elif estimate:
        blocks.append(("p", f"GPU estimate: {estimate}"))
    return blocks


def document(results: dict, tables: dict, figures: list[tuple[str, str, str]]) -> list[tuple]:
    """The report as blocks (see `attnres.report.document`)."""
    fit, baseline = results["fit"], results["fit"]["baseline"]
    c_min, c_max = fit["compute_range"]
    sizes = size_names(results)
    blocks = [("h1", f"attnres scaling: {results.get('preset', '')}")]
    if results.get("description"):
        blocks.append(("p", str(results["description"])))
    blocks += [("p", _summary_text(results)), ("h2", "Conclusion")]
    blocks += [("p", text) for text in conclusion(results) or ["No variant besides standard was trained."]]
    blocks += _size_blocks(results, tables, baseline)
    for law in LAWS:
        blocks += _fit_blocks(fit, law)
    advantage_rows = [advantage_row(law, name, e) for name in fit["advantage"]["saturating"] for law in LAWS
                      for e in [fit["advantage"][law][name]]]
    blocks += [("h2", "Compute advantage over standard"),
               ("p", f"At C_max = {_flops(c_max)} FLOPs, with its {_confidence(fit)} paired-bootstrap interval, and "
                     f"the lowest and highest fitted value over the sweep's compute, {_flops(c_min)} to "
                     f"{_flops(c_max)} FLOPs. {FLOOR.capitalize()} means the variant's fitted loss is below "
                     "standard's fitted floor E, which standard never reaches."),
               ("table", ADVANTAGE_HEADER, advantage_rows, True)]
    blocks += _cost_blocks(results)
    blocks += [("h2", "Final losses"),
               ("p", "Final validation loss (nats/token) per variant and size: mean over seeds ± their sample "
                     "standard deviation where a size has several."),
               ("table", ["variant", *sizes], [[name, *(loss_cell(by_size.get(s)) for s in sizes)]
                                               for name, by_size in tables["final_losses"].items()], True)]
    blocks += _stability_blocks(tables)
    blocks += [("h2", "Figures")] + [("figure", path, alt, caption) for path, alt, caption in figures]
    return blocks + _machine_blocks(results)


# ---------------------------------------------------------------- files

def write_scaling_report(results: dict, out_dir: Path) -> dict:
    """Write results.json, figures/*.png, report.md and index.html into `out_dir` (each atomically).

    results: {"preset", "description", "command", "created", "machine" (`machine_info`), "rules":
    {name: value}, "sizes": [{"name", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
    "intermediate_size", "parameters", "total_parameters", "tokens", "steps", "seeds"}], "variants":
    [{"name", "residual", (its options, for its style), "runs": [{"size", "seed", "parameters",
    "flops", "final_val_loss", "stability" (optional), ...}]}], "fit": `summarize_sweep`'s output,
    "gpu_estimate" (optional)}. Returns {"results", "report", "html", "figures": [paths]}; results.json
    is the input plus "tables" (`derived_tables`) and "figures" (relative paths).
    """
    baseline = _check(results)["name"]
    out_dir = Path(out_dir)
    tables = derived_tables(results, baseline)
    figures = write_figures(results, out_dir)
    paths = [path for path, _, _ in figures]
    json_path, markdown, page = write_document(out_dir, {**results, "tables": tables, "figures": paths},
                                               document(results, tables, figures))
    return {"results": json_path, "report": markdown, "html": page,
            "figures": [out_dir / path for path in paths]}
