"""The README's answer: the headline the protocol's rule draws (`attnres.compare.headline`), one table of the
variants across the settings with their training-step cost and parameters, and the evidence at scale."""

from __future__ import annotations

import decimal
import json
import math
from pathlib import Path

from attnres.analysis.inference import paired_t
from attnres.analysis.contrasts import paired_differences, setting_tests
from attnres.compare.headline import MAIN, PRIMARY, Evidence, draw_headline
from attnres.report.compare_report import signed
from attnres.report.protocol_report import p_text
from tools.pages import costs, fair
from tools.pages.published import PUBLISHED, VARIANT_NAMES, _entries
from tools.pages.seeds import table
from tools.pages.sources import ResultMissing, provenance
from tools.studies import equal_time

SECONDARY = ("full_attnres", "delta_attnres", "denseformer", "mhc")
# The settings in the table's order, the first the main one and the others replications: the protocol's once
# its main study has landed (its dense setting trains 7.7x the 0.2 protocol's steps, so it is also the longer
# training), else the 0.2 protocol's. "equal time" holds per variant the runs of standard trained as long as
# that variant's step costs.
PROTOCOL_SETTINGS = {"dense": "protocol-dense/results.json", "second corpus": "protocol-kjv/results.json",
                     "Kimi Linear": "protocol-kimi-linear/results.json"}
OLD_SETTINGS = {"dense": fair.FAIR_DENSE, "4x steps": fair.FAIR_LONG, "second corpus": fair.FAIR_PYDOCS,
                "Kimi Linear": fair.FAIR_KIMI}
EQUAL_TIME = "protocol-equal-time-{}/results.json"  # per primary variant: standard trained as long as its step costs
SMOLLM2_SHAPE = "bench-fp32-smollm2/bench.json"
NBSP = "\u00a0"  # keeps a figure and its interval on one line when a narrow screen wraps the table
LABELS = {"standard": "standard", "block_attnres": "Block AttnRes", "full_attnres": "Full AttnRes",
          "delta_attnres": "Delta AttnRes", "delta_block": "Delta Block", "denseformer": "DenseFormer",
          "hyper_connections": "hyper-connections", "mhc": "mHC"}


def setting_results(ctx) -> dict[str, tuple[str, dict | None]]:
    """Setting -> (its result file, results) in table order: every setting of the protocol once its main study
    has landed, results None where a replication has not run yet; before that, the 0.2 protocol's committed
    settings."""
    found = {}
    protocol = _read(ctx, PROTOCOL_SETTINGS["dense"]) is not None
    for setting, path in (PROTOCOL_SETTINGS if protocol else OLD_SETTINGS).items():
        results = _read(ctx, path)
        if results is not None or protocol:
            found[setting] = (path, results)
    return found


def _read(ctx, path: str) -> dict | None:
    try:
        return ctx.results.json(path)
    except ResultMissing:
        return None


def _not_run(found: dict) -> list[str]:
    return [setting for setting, (_, results) in found.items() if results is None]


def equal_time_differences(ctx) -> dict[str, list[float]]:
    """Per primary variant with an equal-time arm: its main final runs minus standard's runs of that arm (as many
    more steps as the variant's step costs, the same seeds), per seed."""
    (_, main), *_ = setting_results(ctx).values()
    by_residual = {v["residual"]: v for v in main["variants"]}
    out = {}
    for variant in PRIMARY:
        try:
            arm = ctx.results.json(EQUAL_TIME.format(variant.replace("_", "-")))
        except ResultMissing:
            continue
        longer = next(v for v in arm["variants"] if v["residual"] == "standard")
        pair = {"protocol": main.get("protocol") or {}, "variants": [longer, by_residual[variant]]}
        out[variant] = paired_differences(pair)[variant]
    return out


def evidence(ctx) -> Evidence:
    """The rule's inputs from the committed results: the first setting is the main one; a replication not yet
    run has no differences, so no variant passes the rule's second condition."""
    found = setting_results(ctx)
    (main, (_, main_results)), *others = found.items()
    step = costs.ratios(ctx.results.json(costs.FP32))
    return Evidence(main=paired_differences(main_results, PRIMARY),
                    replications={s: paired_differences(r, PRIMARY) if r else {} for s, (_, r) in others},
                    equal_time=equal_time_differences(ctx),
                    step_cost={v: step.get(v, {}).get("train_step", math.inf) for v in PRIMARY})


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


MAIN_WORDS = "the dense decoder"
SETTING_WORDS = {MAIN: MAIN_WORDS, "4x steps": "4x the steps", "second corpus": "the second corpus"}
PLURAL = {"hyper_connections"}  # "hyper-connections lead"


def _where(settings: list[str]) -> str:
    return _names([SETTING_WORDS.get(s, s) for s in settings])


def _verb(variant: str, singular: str, plural: str) -> str:
    return plural if variant in PLURAL else singular


def recommendation_text(ctx) -> str:
    """The headline sentence, drawn by the rule (docs/explanation/protocol.md, "The headline rule")."""
    ev = evidence(ctx)
    headline = draw_headline(ev)
    label = lambda v: LABELS.get(v, v)  # noqa: E731
    if headline.recommended:
        pick = headline.recommended[0]
        verdict = headline.verdicts[pick]
        low, high = verdict.pooled.ci_hk
        others = [label(v) for v in headline.recommended[1:]]
        return (f"**Use {label(pick)}** (`residual: {pick}`): better than standard on {MAIN_WORDS} after Holm's "
                f"correction ({signed(verdict.main.mean)}, Holm p {p_text(verdict.holm_p)}), in every replication "
                f"(pooled {signed(verdict.pooled.estimate)} [{low:+.3f}, {high:+.3f}]) and at equal training time."
                + (f" {_names(others)} also pass{'es' if len(others) == 1 else ''} the rule." if others else ""))
    leads: dict[str, list[str]] = {}
    for setting, variant in headline.leads.items():
        leads.setdefault(variant, []).append(MAIN if setting == MAIN else setting)
    clauses = []
    for variant, settings in sorted(leads.items(), key=lambda kv: -len(kv[1])):
        clause = (f"{label(variant)} {_verb(variant, 'leads', 'lead') if variant != 'standard' else 'is ahead'} "
                  f"on {_where(settings)}")
        verdict = headline.verdicts.get(variant)
        if verdict is not None:
            if verdict.survives:
                where = "" if settings == [MAIN] else f" on {MAIN_WORDS}"
                clause += f" ({signed(verdict.main.mean)}{where}, Holm p {p_text(verdict.holm_p)})"
            worse = [s for s, m in verdict.replication_means.items() if m > 0]
            behind = [f"on {_where(worse)}"] if worse else []
            if verdict.equal_time_mean is not None and verdict.equal_time_mean > 0:
                behind.append(f"at equal training time ({signed(verdict.equal_time_mean)})")
            if behind:
                clause += f" but {_verb(variant, 'is', 'are')} worse than standard {' and '.join(behind)}"
        clauses.append(clause)
    survivors = [label(v) for v, verdict in headline.verdicts.items() if verdict.survives]
    held = ("no contrast survives Holm's correction on the dense decoder" if not survivors else
            f"the contrasts of all {len(survivors)} survive Holm's correction on the dense decoder"
            if len(survivors) == len(headline.verdicts) > 1 else
            f"only the contrast{'s' if len(survivors) > 1 else ''} of {_names(survivors)} survive"
            f"{'s' if len(survivors) == 1 else ''} Holm's correction on the dense decoder")
    # the protocol trains an equal-time arm only for a variant whose main contrast survives
    pending = [SETTING_WORDS.get(s, s) for s in _not_run(setting_results(ctx))]
    arms = [label(v) for v, verdict in headline.verdicts.items() if verdict.survives and v not in ev.equal_time]
    if arms:
        pending.append(f"the equal-time arm{'s' if len(arms) > 1 else ''} of {_names(arms)}")
    plural = len(pending) > 1 or len(arms) > 1
    missing = f"; {_names(pending)} {'have' if plural else 'has'} not run yet" if pending else ""
    # a variant that passes what has run of the rule may still be recommended: the headline says so, not that
    # no variant wins
    still_open = pending and any(
        verdict.survives and all(m < 0 for m in verdict.replication_means.values())
        and (verdict.equal_time_mean is None or verdict.equal_time_mean < 0) for verdict in headline.verdicts.values())
    opening = "No variant is recommended yet" if still_open else "No variant wins everywhere at this scale"
    first = clauses[0][0].upper() + clauses[0][1:]
    return (f"**{opening}.** {'; '.join([first, *clauses[1:]])}. Of the primary variants, "
            f"{held}{missing}. For the evidence at scale, see [the published results](#at-scale).")


def difference_cell(values: list[float] | None, shown: bool) -> str:
    """Paired differences as mean ± Student-t 95 % half-width, bold where `shown`; "-" where there are none."""
    if not values:
        return "-"
    test = paired_t(values) if len(values) >= 2 and len(set(values)) > 1 else None
    text = signed(sum(values) / len(values)) + ("" if test is None else f"{NBSP}±{NBSP}{test.ci[1] - test.mean:.3f}")
    return f"**{text}**" if shown else text


def _rate_cell(variant: dict) -> str:
    """The variant's peak learning rate in the main setting, and its highest stable rate where fitted."""
    rate = variant.get("chosen_lr")
    stable = (variant.get("fit") or {}).get("highest_stable")
    return "-" if rate is None else f"{rate:.3g}" + ("" if stable is None else f" ({stable:.3g})")


def recommendation_table(ctx) -> str:
    """Variants x settings: the paired test-loss difference to standard in each, bold where it survives Holm's
    correction within its family; the training step at two shapes; the parameters."""
    found = setting_results(ctx)
    per_setting = {}
    for setting, (_, results) in found.items():
        if results is None:
            per_setting[setting] = None
            continue
        tests = setting_tests(results, PRIMARY)["contrasts"]  # Holm within the primary and the secondary family
        marks = {v: entry["verdict"] in ("better", "worse") for v, entry in tests.items()}
        per_setting[setting] = (paired_differences(results), marks)
    equal = equal_time_differences(ctx)
    steps = [costs.ratios(ctx.results.json(path)) for path in (costs.FP32, SMOLLM2_SHAPE)]
    main_results = next(iter(found.values()))[1]
    parameters = {v["residual"]: v.get("parameters") for v in main_results["variants"] if "[" not in v["name"]}
    rates = {v["residual"]: _rate_cell(v) for v in main_results["variants"] if "[" not in v["name"]}
    rows = []
    for variant in ("standard", *PRIMARY, *SECONDARY):
        name = f"`{variant}`" + ("" if variant == "standard" or variant in PRIMARY else " (secondary)")
        if variant == "standard":
            cells = ["baseline"] * len(found) + ["baseline"]
        else:
            pending = "not run" if variant in PRIMARY else "-"  # replications and arms train the primary ones
            cells = [pending if entry is None else difference_cell(entry[0].get(variant), entry[1].get(variant, False))
                     for entry in per_setting.values()]
            cells.append(difference_cell(equal.get(variant), False) if variant in equal else pending)
        step = f"{NBSP}/{NBSP}".join(costs.x(s.get(variant, {}).get("train_step") if variant != "standard" else 1.0)
                                     for s in steps)
        count, base = parameters.get(variant), parameters.get("standard")
        size = "-" if not count or not base else f"{base / 1e6:.2f}M" if variant == "standard" else \
            f"{(count - base) / base * 100:+.1f}{NBSP}%"
        rows.append([name, rates.get(variant, "-"), *cells, step, size])
    header = ["residual", "its lr (highest stable)", *found, "equal time", "train step, fp32, 24x256 / 30x576",
              "parameters"]
    return table(header, rows)


def recommendation_notes(ctx) -> str:
    """What the table's cells mean, the scale of each setting, and what protocol the figures come from."""
    found = setting_results(ctx)
    scales = []
    for setting, (path, results) in found.items():
        if results is None:
            preset = Path(path).parent.name.replace("-", "_")
            scales.append(f"{setting}: not run yet (`tools/studies/protocol.sh {preset}`)")
            continue
        model, train = results["settings"]["model"], results["settings"]["train"]
        seeds = _seeds_text(results)
        protocol = "the protocol" if path.startswith("protocol-") else "the 0.2 protocol"
        base = next((v.get("parameters") for v in results["variants"] if v["residual"] == "standard"), None)
        per = "" if not base else \
            f" ({train['steps'] * train['batch_size'] * train['seq_len'] / base:.2f} tokens per parameter for standard)"
        scales.append(f"{setting}: {model['num_layers']} layers x {model['hidden_size']}, {train['steps']} steps of "
                      f"{train['batch_size']} x {train['seq_len']} tokens{per}, {seeds}, {protocol} "
                      f"([{path.split('/')[0]}](results/{path}))")
    old = [s for s, (path, _) in found.items() if not path.startswith("protocol-")]
    lines = [
        "- **Cells**: test loss minus standard's on the same seed, in nats, mean ± Student-t 95 % half-width, a "
        "failed run counted at its setting's failure threshold; **bold** where it differs from standard after "
        "Holm's correction over its family as that setting trained it (the primary variants; the secondary "
        "ones). '-': the setting does not train that variant (the replications and the equal-time arms train "
        "the primary variants only); 'not run': its study has not run yet.",
        "- **Settings**: " + "; ".join(scales) + ".",
        "- **equal time**: the variant's dense final runs minus standard's trained for as many more steps as the "
        f"variant's training step costs{_step_costs(found)}, on the same seeds (`results/protocol-equal-time-"
        "<variant>`); run only for a variant whose dense contrast survives Holm's correction, and never bold: the "
        "rule reads its sign.",
        "- **its lr**: the peak learning rate of the dense setting's search; in brackets, where the protocol "
        "fitted it, the highest rate at which no run failed.",
        "- **train step**: multiples of standard's median training step, fp32, interleaved in one run, at 24 layers "
        "x 256 and at SmolLM2-135M's 30 layers x 576 ([bench-fp32](results/bench-fp32/bench.json), "
        f"[bench-fp32-smollm2](results/{SMOLLM2_SHAPE})); **parameters**: at the dense setting's size.",
    ]
    if old:
        lines.append(f"- {_names(old)} come from the 0.2 protocol: a rate is the argmin of a grid whose runs are "
                     "among the final seeds (the 4x-steps and second-corpus runs reuse the dense search's rates), "
                     "with no correction. The pre-registered [protocol](docs/explanation/protocol.md) replaces each "
                     "setting as its study lands.")
    return "\n".join(lines)


def _seeds_text(results: dict) -> str:
    """"16 seeds", or "16 seeds (8 for the secondary variants)" where the protocol gives those fewer."""
    counts = {}
    for variant in results["variants"]:
        counts.setdefault(variant.get("primary", True), set()).add(len({r["seed"] for r in variant["runs"]}))
    main = max(counts.get(True) or counts[False])
    fewer = sorted(n for n in counts.get(False, ()) if n != main)
    return f"{main} seeds" + (f" ({_names([str(n) for n in fewer])} for the secondary variants)" if fewer else "")


def _step_costs(found: dict) -> str:
    """The factor c each equal-time arm trains standard longer by (`tools.studies.equal_time.arms`, which wrote
    the arms' presets), as text; "" where the main setting has no protocol cost measurement."""
    path, main = next(iter(found.values()))
    if not path.startswith("protocol-"):
        return ""
    try:
        factors = equal_time.arms(main)
    except ValueError:  # its cost measurement is not the protocol's: no arm is defined by it
        return ""
    ratios = [f"{LABELS[r]} {c:.2f}x" for r, c in factors.items()]
    return f" at the dense setting's own shape on one thread ({_names(ratios)})" if ratios else ""


def recommendation_sources(ctx) -> str:
    """Where every column of the table comes from, with each source's command, date and machine."""
    parts = {**{f"Loss, {s}": p for s, (p, r) in setting_results(ctx).items() if r is not None},
             "Train step, 24x256": costs.FP32, "Train step, 30x576": SMOLLM2_SHAPE}
    lines = []
    for label, path in parts.items():
        result = ctx.results.json(path)
        code = costs.code_path(result) if path.endswith("bench.json") else None
        lines.append(f"- {label}: " + provenance(result, ctx.source(path), code_path=code).strip("*"))
    return "\n".join(lines)


# The variants the first screen's evidence at scale names (a source's own label for ours, where it differs)
AT_SCALE_VARIANTS = (*PRIMARY, *SECONDARY, "attn_residuals", "attnres_block")


def at_scale(ctx) -> str:
    """The evidence at scale: a line per source with what it finds, and under it a line per variant of ours it
    reports against standard, with how often it is better and its figure at the largest scale printed."""
    ctx.source(PUBLISHED)
    data = json.loads(ctx.results.path(PUBLISHED).read_text(), parse_float=decimal.Decimal)  # 29.70, not 29.7
    lines = []
    for src in data["sources"]:
        found = [(v, entries) for v in AT_SCALE_VARIANTS if (entries := _entries(src, v))]
        if not found:
            continue
        lines.append(f"- [{src['short']}]({src['url']})" + (f": {src['headline']}." if src.get("headline") else ""))
        for variant, entries in found:
            better = sum(d == "better" for d, _ in entries)
            lines.append(f"  - {VARIANT_NAMES.get(variant, variant)}: better than standard in {better} of "
                         f"{len(entries)}; last printed, {entries[-1][1]} ({entries[-1][0]}).")
    return "\n".join(lines) + (f"\n\n*Every figure as printed, and where it was read: {ctx.source(PUBLISHED)}; "
                               f"all of them on [the results page](docs/explanation/results.md#published-results-at-scale).*")
