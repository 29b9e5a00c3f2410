"""The protocol's studies on the results page (docs/explanation/protocol.md): a study's fitted rates and tests,
the headline rule's evidence per primary variant across the settings, and the main runs again on another
floating-point path."""

from __future__ import annotations

from attnres.analysis.contrasts import setting_tests
from attnres.compare.headline import PRIMARY, draw_headline
from attnres.report.compare_report import signed
from attnres.report.protocol_report import (FIT_HEADER, analysis_of, fit_rows, p_text, reading_text, test_header,
                                            test_rows)
from tools.pages import recommendation
from tools.pages.fair import run_moves
from tools.pages.seeds import table
from tools.pages.sources import provenance

SETTINGS = recommendation.PROTOCOL_SETTINGS
MAIN = SETTINGS["dense"]
OTHER_PATH = "protocol-dense-avx2/results.json"  # the main setting's primary final runs under ATEN_CPU_CAPABILITY=avx2


def _interval(mean: float, ci) -> str:
    return f"{signed(mean)} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def protocol_tests(ctx, path: str = MAIN) -> str:
    """A protocol study's fitted rates, then its tests: each variant against standard paired by seed, Holm within
    its family, TOST, failure rates, and the best-test among the primary variants; then how much of its training
    split a run reads, in tokens per parameter, and its training-minus-validation gap."""
    results = ctx.results.json(path)
    analysis = analysis_of(results)
    best = analysis["best"]
    shown = "" if best is None else (f" Best-test among the primary variants and standard: {best['candidate']} "
                                     f"{'is' if best['shown_best'] else 'is not'} shown better than each other one.")
    return "\n\n".join([
        table(FIT_HEADER, fit_rows(results)),
        table(test_header(analysis), test_rows(results, analysis)),
        "Test loss in nats, variant minus standard on the same seed; Holm's correction within the primary and "
        "within the secondary family; 'equivalent' only where two one-sided tests reject a difference as large as "
        "the margin; a failed run counts at the failure threshold, and its rate has a Clopper-Pearson interval."
        + shown, " ".join(filter(None, [reading_text(results), provenance(results, ctx.source(path))]))])


def protocol_rule(ctx) -> str:
    """The headline rule's inputs and its three conditions, one row per primary variant (`attnres.compare.headline`
    applied to the committed results, as the README's headline is)."""
    evidence = recommendation.evidence(ctx)
    headline = draw_headline(evidence)
    replications = list(recommendation.setting_results(ctx))[1:]
    yes = {True: "yes", False: "no"}
    rows = []
    for variant, verdict in headline.verdicts.items():
        main = "-" if verdict.main is None else _interval(verdict.main.mean, verdict.main.ci)
        means = [signed(verdict.replication_means[s]) if s in verdict.replication_means else "not run"
                 for s in replications]
        # a condition whose evidence has not all run reads "not yet", unless what has run already fails it
        waiting = len(verdict.replication_means) < len(replications)
        pooled = "-" if verdict.pooled is None else _interval(verdict.pooled.estimate, verdict.pooled.ci_hk)
        if waiting and verdict.pooled is not None:  # an interim pool, not yet the protocol's over every setting
            pooled += f", {len(verdict.replication_means) + 1} of {len(replications) + 1} settings"
        replicates = ("no" if any(m >= 0 for m in verdict.replication_means.values()) else "not yet") \
            if waiting else yes[verdict.replicates]
        if variant in evidence.equal_time:
            equal = recommendation.difference_cell(evidence.equal_time[variant], False)
            holds = yes[verdict.holds_at_equal_time]
        else:  # the protocol runs an arm only for a survivor
            equal, holds = ("not run", "not yet") if verdict.survives else ("not needed", "-")
        rows.append([recommendation.LABELS[variant], main, p_text(verdict.holm_p), *means, pooled, equal,
                     yes[verdict.survives], replicates, holds, "**recommended**" if verdict.recommended else "no"])
    header = ["variant", "dense [95 % CI]", "Holm p", *replications, "pooled [Hartung-Knapp 95 %]", "equal time",
              "1. survives", "2. replicates", "3. holds at equal time", "headline"]
    return "\n\n".join([table(header, rows),
                        "Test loss minus standard's, in nats, mean over seeds paired with standard's. The rule "
                        "recommends a variant only where all three conditions hold: 1. its dense contrast is "
                        "negative and survives Holm's correction over the primary variants; 2. its mean is "
                        "negative in every replication and the pooled interval over the settings (random effects) "
                        "lies below 0; 3. standard trained as long as the variant's step costs does not reverse it. "
                        "Equal time: mean ± Student-t 95 % half-width. 'not yet': a setting the condition needs has "
                        "not run, and what has run does not already fail it; a pooled interval over fewer settings "
                        "than the protocol's says how many."])


def _capability(results: dict) -> str:
    """The ATen kernel level the runs trained on: their own records' where they hold one, else the report's."""
    levels = {(r.get("machine") or {}).get("cpu_capability") for v in results["variants"] for r in v["runs"]}
    levels.discard(None)
    return ", ".join(sorted(levels)) if levels else (results.get("machine") or {}).get("cpu_capability", "?")


def path_check(main: dict, rerun: dict) -> dict:
    """The rerun's seeds against the main study's same runs: {"moves": `run_moves`, "contrasts": {residual:
    (main's contrast over those seeds, the rerun's), each `setting_tests`'s entry}}."""
    seeds = {r["seed"] for v in rerun["variants"] for r in v["runs"]}
    names = {v["name"] for v in rerun["variants"]}
    same = {**main, "variants": [{**v, "runs": [r for r in v["runs"] if r["seed"] in seeds]}
                                 for v in main["variants"] if v["name"] in names]}
    here, there = setting_tests(same, PRIMARY)["contrasts"], setting_tests(rerun, PRIMARY)["contrasts"]
    return {"moves": run_moves(main, rerun), "contrasts": {r: (here[r], there[r]) for r in here if r in there}}


def _decided(entry: dict) -> bool:
    return entry["verdict"] in ("better", "worse")


def protocol_paths(ctx) -> str:
    """The main setting's primary final runs again on another ATen kernel path: how far each run moved, and
    whether any primary contrast changed sign or its Holm decision."""
    main, rerun = ctx.results.json(MAIN), ctx.results.json(OTHER_PATH)
    check = path_check(main, rerun)
    names = {v["residual"]: v["name"] for v in rerun["variants"]}
    rows = []
    for residual, (here, there) in check["contrasts"].items():
        moves = [abs(m["moved"]) for m in check["moves"] if m["variant"] == names[residual]]
        rows.append([recommendation.LABELS[residual], _interval(here["mean"], here["ci"]),
                     _interval(there["mean"], there["ci"]), f"{p_text(here['holm_p'])} / {p_text(there['holm_p'])}",
                     "yes" if (here["mean"] < 0) != (there["mean"] < 0) else "no",
                     "yes" if _decided(here) != _decided(there) else "no", f"{max(moves):.4f}"])
    largest = max(check["moves"], key=lambda m: abs(m["moved"]))
    seeds = sorted({m["seed"] for m in check["moves"]})
    header = ["variant", f"Δ on {_capability(main)}", f"Δ on {_capability(rerun)}", "Holm p (each)",
              "sign changed", "Holm decision changed", "largest move of its runs"]
    return "\n\n".join([
        table(header, rows),
        f"Seeds {seeds[0]}–{seeds[-1]} of the main setting's final runs of the primary variants, trained again at "
        f"the same rates; Δ is test loss minus standard's on the same seed, over these seeds only. The largest move "
        f"of a run's own test loss: {signed(largest['moved'])} nats ({largest['variant']}, seed {largest['seed']}, "
        f"over {len(check['moves'])} runs). " + provenance(rerun, ctx.source(OTHER_PATH))])
