"""The README's answer: one row per variant with its loss difference to standard, compute advantage,
training-step and memory cost, decoding cost and exact conversion; and the recommendation drawn from
them by a stated rule."""

from __future__ import annotations

import decimal
import json

from attnres.analysis.intervals import mean
from attnres.model.model_config import entry_options
from tools.pages import costs, fair, scaling
from tools.pages.conversion import CONVERSION, exact_conversion
from tools.pages.conversion import verdict as exact_conversion_words
from tools.pages.published import PUBLISHED, source
from tools.pages.seeds import excludes_zero, signed_interval, table
from tools.pages.sources import ResultMissing, provenance
from attnres.report.compare_report import signed

CHEAP = 1.2  # "cheap": a training step at most this multiple of standard's, in fp32 and in bf16
NBSP = "\u00a0"  # keeps a figure and its interval on one line when a narrow screen wraps the table
LABELS = {"standard": "standard", "block_attnres": "Block AttnRes", "full_attnres": "Full AttnRes",
          "delta_attnres": "Delta AttnRes", "delta_block": "Delta Block", "denseformer": "DenseFormer",
          "hyper_connections": "hyper-connections", "mhc": "mHC"}


def _by_residual(results: dict, names) -> dict[str, str]:
    """residual -> the name of its run with default router options (the ablated routers carry '[...]')."""
    residual = {v["name"]: v["residual"] for v in results["variants"]}
    return {residual[name]: name for name in names if "[" not in name}


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def variant_rows(ctx) -> list[dict]:
    """Per variant (standard first, then by test-loss difference): every figure of the table, as numbers.
    The loss is the fair fight's (results/fair-dense): each variant at its own best learning rate."""
    fair_results = ctx.results.json(fair.FAIR_DENSE)
    summary = fair.fair_summary(fair_results)
    in_fair = _by_residual(fair_results, list(summary))
    scaling_results = ctx.results.json(scaling.SCALING)
    in_scaling = _by_residual(scaling_results, [v["name"] for v in scaling_results["variants"]])
    fp32, bf16 = (costs.ratios(ctx.results.json(p)) for p in (costs.FP32, costs.BF16))
    converts = exact_conversion(ctx.results)
    rows = []
    for residual, name in in_fair.items():
        entry = summary[name]
        rows.append({"residual": residual, "name": name, "loss": None if residual == "standard" else entry,
                     "verdict": "best" if entry["best"] else entry["tied"], "lr": entry["lr"],
                     "advantage": scaling.advantage_at_max(scaling_results, in_scaling[residual])
                     if residual in in_scaling and residual != "standard" else None,
                     "fp32": fp32.get(residual, {}), "bf16": bf16.get(residual, {}),
                     "converts": converts.get(residual, "not measured")})
    return sorted(rows, key=lambda r: (r["residual"] != "standard", r["loss"]["mean"] if r["loss"] else 0))


def _loss_cell(loss: dict | None) -> str:
    if loss is None:
        return "baseline"
    half = "" if loss["half"] is None else f"{NBSP}±{NBSP}{loss['half']:.3f}"
    return f"{signed(loss['mean'])}{half}"


def _verdict_cell(verdict) -> str:
    return {"best": "best", True: "tied", False: "worse", None: "-"}[verdict]


def _advantage_cell(advantage: dict | None, residual: str) -> str:
    if residual == "standard":
        return "1"
    if advantage is None:
        return "not in the sweep"
    value, low, high = (advantage[k] for k in ("value", "low", "high"))
    if value is None:
        return "beyond standard's floor"
    interval = "" if low is None or high is None else f"{NBSP}[{low:.2f},{NBSP}{high:.2f}]"
    return f"{value:.2f}x{interval}" + ("" if advantage["law"] == "saturating" else " (power law)")


def recommendation_table(ctx) -> str:
    """The table at the top of the README."""
    rows = []
    for r in variant_rows(ctx):
        f, b = r["fp32"], r["bf16"]
        rows.append([f"`{r['residual']}`", f"{r['lr']:.3g}", _loss_cell(r["loss"]), _verdict_cell(r["verdict"]),
                     _advantage_cell(r["advantage"], r["residual"]),
                     f"{_times(f.get('train_step'))}{NBSP}/{NBSP}{_times(b.get('train_step'))}",
                     f"{_times(f.get('peak_memory'))}{NBSP}/{NBSP}{_times(b.get('peak_memory'))}",
                     _times(f.get("decode_compiled_per_token")), r["converts"]])
    header = ["residual", "its lr", "Δ test loss, nats (95 % CI)", "against the best",
              "compute advantage, FLOPs (95 % CI)", "train step, fp32 / bf16", "CPU peak memory (estimate), fp32 / bf16",
              "decode per token", "converts exactly"]
    return table(header, rows)


def _excludes_one(interval: dict | None) -> bool | None:
    """Whether an advantage's interval lies above 1 (None without an interval)."""
    return None if not interval or interval.get("low") is None else interval["low"] > 1


def _option_settings(entry: dict | None) -> list[str]:
    """A result entry's options that differ from their defaults, as YAML settings: ["`num_blocks: 8`"]."""
    options = entry_options(entry) if entry else None
    if options is None:
        return []
    defaults = options.defaults()
    return [f"`{name}: {value}`" for name, value in options.to_dict().items()
            if value is not None and (name not in defaults or value != defaults[name])]


def _step(row: dict) -> float:
    """The larger of a row's fp32 and bf16 training-step ratios (inf where one was not measured)."""
    return max(row[p].get("train_step") or float("inf") for p in ("fp32", "bf16"))


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _cheap_choice(rows: list[dict], label) -> str:
    """The best variant whose training step is at most CHEAP x standard's in fp32 and bf16, and those tied with
    it (paired by seed: the difference of their differences to standard)."""
    cheap = [r for r in rows if _step(r) <= CHEAP or r["residual"] == "standard"]
    seeds = len(next(r["loss"]["diffs"] for r in rows if r["loss"]))
    diffs = {r["name"]: r["loss"]["diffs"] if r["loss"] else [0.0] * seeds for r in cheap}
    top = min(cheap, key=lambda r: mean(diffs[r["name"]]))
    tied = [label(r) for r in cheap if r is not top and not excludes_zero(
        [a - b for a, b in zip(diffs[r["name"]], diffs[top["name"]])])]
    head = f"At most {CHEAP}x standard's training step in fp32 and bf16, "
    if top["residual"] == "standard":
        return head + "no variant is shown better than standard."
    return (head + f"{label(top)} has the lowest test loss ({_loss_cell(top['loss']).replace(NBSP, ' ')} against "
            f"standard)" + (f"; {_names(tied)} {'is' if len(tied) == 1 else 'are'} not distinguishable from it."
                            if tied else ", ahead of the others by a paired 95 % interval."))


def recommendation_text(ctx) -> str:
    """The recommendation, drawn from the table's figures by the rule it states, and the evidence's scale.

    The rule: the variants whose test loss is not distinguishable from the best one's (the paired 95 %
    interval of the difference includes 0) are tied. If standard is among them, keep standard; else use
    the tied variant with the cheapest training step (the larger of its fp32 and bf16 ratios), and when
    that step is above CHEAP x standard's, name the best variant at most that dear too."""
    rows = variant_rows(ctx)
    fair_results = ctx.results.json(fair.FAIR_DENSE)
    entries = {v["name"]: v for v in fair_results["variants"]}
    label = lambda r: LABELS.get(r["residual"], r["residual"])  # noqa: E731
    group = [r for r in rows if r["verdict"] in ("best", True)]
    best = next(r for r in rows if r["verdict"] == "best")
    lines = []
    if any(r["residual"] == "standard" for r in group):
        others = [label(r) for r in group if r["residual"] != "standard"]
        lines.append("**Keep `standard`**: at each variant's own best learning rate, "
                     + (f"{_names(others)} {'is' if len(others) == 1 else 'are'} not distinguishable from it "
                        if others else "no variant is distinguishable from it ")
                     + "and every other variant is worse (paired 95 % intervals of the test-loss difference).")
    else:
        pick = min(group, key=_step)
        setting = ", ".join([f"`residual: {pick['residual']}`", *_option_settings(entries.get(pick["name"]))])
        tied = [label(r) for r in group]
        step = (f"{_times(pick['fp32'].get('train_step'))} (fp32) and {_times(pick['bf16'].get('train_step'))} "
                f"(bf16) of standard's")
        lines.append(f"**Use {label(pick)}** ({setting}): "
                     + (f"{_names(tied)} are not distinguishable at this scale (the paired 95 % intervals of "
                        f"their test-loss differences to the best include 0), and of them it has the cheapest "
                        f"training step, {step}." if len(tied) > 1 else
                        f"it has the lowest test loss, ahead of every other variant by a paired 95 % interval, "
                        f"at a training step {step}."))
        advantage = pick["advantage"]
        if advantage is not None:
            flops = "excludes" if _excludes_one(advantage) else "holds"
            time = _excludes_one(advantage.get("time"))
            lines[-1] += (f" In the scaling sweep, at one learning rate for every variant, its compute advantage's "
                         f"interval {flops} 1 in training FLOPs"
                         + ("" if time is None else f" and {'excludes' if time else 'holds'} 1 in wall-clock time "
                            "on the sweep's CPU") + ".")
        if best is not pick:
            lines[-1] += (f" The lowest mean test loss is {label(best)}'s, at {_times(best['fp32'].get('train_step'))} "
                          f"(fp32) and {_times(best['bf16'].get('train_step'))} (bf16) of standard's training step.")
        if _step(pick) > CHEAP:
            lines.append(_cheap_choice(rows, label))
    not_better = [label(r) for r in rows if r["loss"] and not (r["loss"]["excludes_zero"] and r["loss"]["mean"] < 0)]
    if not_better:
        lines[-1] += f" Not shown better than standard: {_names(not_better)}."
    lines.append(f"Scale of the evidence: the loss column from the dense decoder, {fair.scale_words(fair_results)}, each variant's rate "
                 f"the best of one grid on validation, the loss on a test split that chose nothing; the compute "
                 f"advantage from {scaling.sweep_words(scaling_results := ctx.results.json(scaling.SCALING))} at "
                 f"one learning rate ({scaling_results['settings']['train']['lr']:g} for every variant); costs at "
                 f"{costs.shape_words(ctx.results.json(costs.FP32))}.")
    beyond = kimi_linear_words(ctx) + later_studies_words(ctx, fair_results)
    if beyond:
        lines.append(beyond.strip())
    return "\n\n".join(lines)


def _label(name: str) -> str:
    return LABELS.get(name.split(" ")[0], name)  # "block_attnres (N=8)" -> Block AttnRes


def kimi_linear_words(ctx) -> str:
    """The fair fight on Kimi Linear in two sentences: its best variant, which are better and worse than
    standard, and the best rates on the searched grid's edge; "" while it is not committed."""
    try:
        results = ctx.results.json(fair.FAIR_KIMI)
    except ResultMissing:
        return ""
    summary, verdict = fair.fair_summary(results), fair.verdicts(results)
    model = results["settings"]["model"]
    seeds = results["protocol"]["final_seeds"]
    best = verdict["best"][0]
    entry = summary[best]
    if entry["residual"] == "standard":
        head = "standard has the lowest test loss"
    else:
        shown = "better than" if best in verdict["better"] else "not distinguishable from"
        head = (f"{_label(best)} has the lowest test loss, {shown} standard "
                f"({signed_interval(entry['diffs'])})")
    worse = [_label(n) for n in verdict["worse"]]
    alike = [_label(n) for n in verdict["alike"] if n != best]
    words = (f" **On Kimi Linear** (MoE with MLA and KDA attention, {model['num_layers']} layers x "
             f"{model['hidden_size']}) under the same protocol, {seeds} seeds at each variant's own rate, {head}"
             + (f"; {_names(worse)} {'is' if len(worse) == 1 else 'are'} worse than standard" if worse else "")
             + (f"; {_names(alike)} {'is' if len(alike) == 1 else 'are'} not distinguishable from it" if alike else "")
             + ".")
    edge = [n for n, e in summary.items() if e["edge"] == "high"]
    if edge:
        names = _names(["standard's" if summary[n]["residual"] == "standard" else f"{_label(n)}'s" for n in edge])
        rates = sorted({summary[n]["lr"] for n in edge})
        words += (f" The search left {names} best rate{'s' if len(edge) > 1 else ''} on its high edge "
                  f"({', '.join(f'{r:g}' for r in rates)}): {'they' if len(edge) > 1 else 'it'} may lie higher.")
    return words


# the later studies at the fair fight's rates, and how the answer names each
LATER_STUDIES = ((fair.FAIR_PYDOCS, "**On a second corpus** (the Python documentation)"),
                 (fair.FAIR_LONG, "**At 4x the training steps**"))


def later_studies_words(ctx, fair_results: dict) -> str:
    """A sentence per later study at hand (fair.LATER_STUDIES): whether it ranks the variants as the fair
    fight does, and which variants it shows better than standard; "" when none is committed yet."""
    words = []
    for path, what in LATER_STUDIES:
        try:
            later = ctx.results.json(path)
        except ResultMissing:
            continue
        order, ours = ([_label(name) for name in names] for names in fair.rankings(fair_results, later))
        better = [_label(name) for name in fair.shown_better(later)]
        seeds = len(later["seeds"])
        words.append(f" {what}, {seeds} seeds at the fair fight's rates, the variants rank "
                     + ("as above" if order == ours else f"differently, best first: {', '.join(order)}")
                     + f"; {_names(better) + (' is' if len(better) == 1 else ' are') if better else 'none is'} "
                       f"shown better than standard.")
    return "".join(words)


def recommendation_sources(ctx) -> str:
    """Where every column of the table comes from, with each source's command, date and machine."""
    parts = {"Loss": (fair.FAIR_DENSE, None), "Compute advantage": (scaling.SCALING, "cost"),
             "Costs, fp32": (costs.FP32, "bench"), "Costs, bf16": (costs.BF16, "bench")}
    lines = []
    for label, (path, kind) in parts.items():
        result = ctx.results.json(path)
        code = (costs.code_path(result) if kind == "bench" else result["cost"]["settings"] if kind == "cost" else None)
        lines.append(f"- {label}: " + provenance(result, ctx.source(path), code_path=code).strip("*"))
    conversion = ctx.results.json(CONVERSION)
    lines.append("- Exact conversion: " + provenance(conversion, ctx.source(CONVERSION)).strip("*"))
    return "\n".join(lines)


# The published sources the first screen sets beside the answer, in order (results/published/published.json).
AT_SCALE = ("kimi", "delta", "marin_9290")
# A source's label for a variant that is ours under another name: marin's "attn_residuals" is probably Block
# AttnRes (its variant_note), so it is compared with ours as Block, saying so.
SAME_AS = {"attn_residuals": "block_attnres"}


def headline_row(source: dict) -> dict:
    """A source's row the first screen quotes: of its held-out rows (no ablation, no train loss), the one
    with the most variants besides standard, the last (largest scale) among equals."""
    rows = [r for r in source["rows"] if not any(w in r["label"].lower() for w in ("ablation", "train"))
            and r["values"].get("standard") is not None]
    return max(reversed(rows), key=lambda r: sum(v is not None for k, v in r["values"].items() if k != "standard"))


def _direction(difference: float | None) -> str | None:
    return None if difference is None else "better" if difference < 0 else "worse"


def at_scale(ctx) -> str:
    """One line per published source at scale: which variants beat standard there (at its largest scale
    with the most variants), its own claim, and where the answer here agrees or does not."""
    ours = {r["residual"]: r for r in variant_rows(ctx)}
    ctx.source(PUBLISHED)
    printed = json.loads(ctx.results.path(PUBLISHED).read_text(), parse_float=decimal.Decimal)  # 29.70, not 29.7
    lines = []
    for key in AT_SCALE:
        source(ctx.results, key)  # refuses an unknown key by name
        src = next(s for s in printed["sources"] if s["key"] == key)
        row = headline_row(src)
        base = row["values"]["standard"]
        theirs = {k: _direction(float(v - base)) for k, v in row["values"].items() if k != "standard" and v is not None}
        agree, disagree = [], []
        for name, direction in theirs.items():
            residual = SAME_AS.get(name, name)
            loss = (ours.get(residual) or {}).get("loss")
            if loss is None:
                continue
            here = ("better" if loss["mean"] < 0 else "worse") if loss["excludes_zero"] else "no different"
            (agree if here == direction else disagree).append(
                f"{LABELS.get(residual, residual)} ({here} here, {signed(loss['mean'])})")
        parts = [f"{LABELS.get(SAME_AS.get(k, k), k)}{' (form not stated)' if k in SAME_AS else ''} "
                 f"{row['values'][k]} ({d})" for k, d in theirs.items()]
        line = (f"- **[{src['short']}]({src['url']})**, {row['scale']}, {src['metric']}: standard {base}; "
                f"{', '.join(parts)}. {src['headline']}. "
                f"Here: agrees on {_names(agree) if agree else 'none'}; differs on "
                f"{_names(disagree) if disagree else 'none'}.")
        lines.append(line)
    return "\n".join(lines) + (f"\n\n*Each source at its largest scale with the most variants, figures as read "
                               f"there ({ctx.source(PUBLISHED)}); here: the loss column above.*")


def recommendation_notes(ctx) -> str:
    """What each column of the table means, in one line each, with the figures behind its words."""
    fair_results, bench = ctx.results.json(fair.FAIR_DENSE), ctx.results.json(costs.FP32)
    conversion = [e for e in ctx.results.json(CONVERSION)["variants"]
                  if e.get("dtype", "float32") == "float32" and e.get("max_abs_logit_diff")]
    eps = [e for e in conversion if exact_conversion_words(e) == "yes, to the RMSNorm eps"]
    models, grid = bench["models"], fair_results["protocol"]
    lines = [
        f"- **its lr**: the peak learning rate the search chose for the variant, the lowest mean validation loss "
        f"over {grid['grid_seeds']} seeds at each of {', '.join(f'{r:g}' for r in grid['lr_grid'])} (extended where "
        f"the best was on the edge).",
        "- **Δ test loss**: test loss minus standard's on the same seed, mean and Student-t 95 % interval; **against "
        "the best**: tied when the paired interval to the variant with the lowest test loss includes 0.",
        "- **compute advantage**: how much less training compute the variant needs for standard's loss at the "
        "sweep's largest compute, from the saturating law L(C) = A·C^-α + E fitted per variant (a plain power law "
        "where marked), 95 % paired-bootstrap interval.",
        f"- **train step, CPU peak memory, decode per token**: multiples of standard's median in the same run, "
        f"interleaved, at {models['num_layers']} layers x {models['hidden_size']} wide; peak memory on a CPU is "
        f"an estimate (parameters, gradients, AdamW moments and the activations saved for backward); decode is "
        f"the compiled static-cache step, fp32, {models['decode_tokens']} tokens.",
    ]
    if eps:
        gaps = [e["max_abs_logit_diff"] for e in eps]
        lines.append(f"- **converts exactly**: the converted SmolLM2-135M's logits against the source's at step 0; "
                     f"'to the RMSNorm eps': every argmax kept, logits at most {max(gaps):.3f} apart (largest logit "
                     f"{eps[0]['max_abs_logit']:.1f}): the sub-layer's RMSNorm reads the routed mean x/n where the source read x, "
                     f"equal but for the norm's eps (method §4).")
    return "\n".join(lines)
