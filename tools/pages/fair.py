"""The fair fight (results/fair-dense: tools/studies/fair.sh): every variant at its own best learning rate from
one grid, reported on a test split that chose nothing, differences paired by seed, ties with the best."""

from __future__ import annotations

from attnres.analysis.intervals import ci95_halfwidth, mean
from tools.pages.ablation import ABLATION, paired_summary
from tools.pages.seeds import excludes_zero, seed_range, signed_interval, table
from tools.pages.sources import provenance
from attnres.report.compare_report import signed
from attnres.report.protocol_report import paired_runs, search_rows, ties_sentence

FAIR_DENSE = "fair-dense/results.json"


def test_losses_by_seed(variant: dict) -> dict[int, float]:
    """Seed -> final test loss of one variant's final runs."""
    return {run["seed"]: float(run["final_test_loss"]) for run in variant["runs"]}


def paired_test_difference(variant: dict, reference: dict) -> list[float]:
    """The variant's test loss minus the reference's, per seed both have, in seed order."""
    return paired_runs(variant["runs"], reference["runs"])


def fair_summary(results: dict) -> dict[str, dict]:
    """Per variant name: its paired test-loss differences to standard ("diffs"), their mean, 95 % half-width
    and whether it excludes 0, the chosen rate, and the report's verdict against the best ("best", "tied")."""
    variants = {v["name"]: v for v in results["variants"]}
    base = next(v for v in results["variants"] if v["residual"] == "standard")
    out = {}
    for name, variant in variants.items():
        diffs = paired_test_difference(variant, base)
        verdict = results["summary"][name]
        out[name] = {"residual": variant["residual"], "diffs": diffs, "mean": mean(diffs),
                     "half": ci95_halfwidth(diffs), "excludes_zero": excludes_zero(diffs), "lr": variant["chosen_lr"],
                     "best": verdict["best"], "tied": verdict["tied"], "edge": variant.get("edge")}
    return out


def scale_words(results: dict) -> str:
    """'16 layers x 64 wide (0.92M parameters), 240 steps of 8 x 128 tokens, 8 seeds at each variant's rate'."""
    model, train = results["settings"]["model"], results["settings"]["train"]
    base = next(v for v in results["variants"] if v["residual"] == "standard")
    size = f" ({base['parameters'] / 1e6:.2f}M parameters)" if base.get("parameters") else ""
    seeds = results["protocol"]["final_seeds"]
    return (f"{model['num_layers']} layers x {model['hidden_size']} wide{size}, {train['steps']} steps of "
            f"{train['batch_size']} x {train['seq_len']} tokens, {seeds} seeds at each variant's own best rate")


def protocol_search(ctx, path: str) -> str:
    """The learning-rate search of a protocol study: mean validation loss of every variant at every rate,
    its choice in bold."""
    results = ctx.results.json(path)
    header, rows = search_rows(results)
    grid = results["protocol"]
    return "\n\n".join([table(header, rows),
                        f"Mean validation loss over {grid['grid_seeds']} seeds per rate; the chosen rate's in bold. "
                        + provenance(results, ctx.source(path))])


def protocol_results(ctx, path: str) -> str:
    """The final runs of a protocol study on the test split: each variant against standard paired by seed,
    and against the best."""
    results = ctx.results.json(path)
    summary = fair_summary(results)
    rows = []
    for name, entry in sorted(summary.items(), key=lambda item: item[1]["mean"]):
        verdict = "best" if entry["best"] else {True: "tied", False: "worse", None: "-"}[entry["tied"]]
        rows.append([name, f"{entry['lr']:.3g}", str(len(entry["diffs"])),
                     "baseline" if entry["residual"] == "standard" else signed_interval(entry["diffs"]),
                     "-" if entry["residual"] == "standard" else seed_range(entry["diffs"]), verdict])
    header = ["variant", "its lr", "seeds", "Δ test loss vs standard (95 % CI)", "seeds' range", "against the best"]
    return "\n\n".join([table(header, rows),
                        ties_sentence(results["summary"]) + f" Scale: {scale_words(results)}. "
                        + provenance(results, ctx.source(path))])


def fair_search(ctx) -> str:
    """The dense fair fight's learning-rate search."""
    return protocol_search(ctx, FAIR_DENSE)


def fair_results(ctx) -> str:
    """The dense fair fight's final runs."""
    return protocol_results(ctx, FAIR_DENSE)


FAIR_KIMI = "fair-kimi-linear/results.json"


def fair_kimi_search(ctx) -> str:
    """The fair fight on Kimi Linear: its learning-rate search."""
    return protocol_search(ctx, FAIR_KIMI)


def fair_kimi_results(ctx) -> str:
    """The fair fight on Kimi Linear: its final runs, hyper-connections included whichever way they fall."""
    return protocol_results(ctx, FAIR_KIMI)


FAIR_KERNELS = "fair-dense-kernels/results.json"


def kernel_moves(fair_results: dict, rerun: dict) -> list[dict]:
    """Per routed variant and seed in both: its paired test-loss difference to standard in the study and in
    the rerun on another kernel path, and how far it moved: {"variant", "seed", "study", "rerun", "moved"}."""
    study = {v["name"]: test_losses_by_seed(v) for v in fair_results["variants"]}
    other = {v["name"]: test_losses_by_seed(v) for v in rerun["variants"]}
    base = next(v["name"] for v in fair_results["variants"] if v["residual"] == "standard")
    rows = []
    for name in (n for n in study if n != base and n in other):
        for seed in sorted(set(study[name]) & set(other[name]) & set(study[base]) & set(other.get(base, {}))):
            here, there = study[name][seed] - study[base][seed], other[name][seed] - other[base][seed]
            rows.append({"variant": name, "seed": seed, "study": here, "rerun": there, "moved": there - here})
    return rows


def run_moves(fair_results: dict, rerun: dict) -> list[dict]:
    """Per variant and seed in both: how far its own test loss moved in the rerun: {"variant", "seed", "moved"}."""
    study = {v["name"]: test_losses_by_seed(v) for v in fair_results["variants"]}
    return [{"variant": v["name"], "seed": seed, "moved": loss - study[v["name"]][seed]}
            for v in rerun["variants"] if v["name"] in study
            for seed, loss in sorted(test_losses_by_seed(v).items()) if seed in study[v["name"]]]


def fair_kernels(ctx) -> str:
    """How far the fair fight's paired differences move on another kernel path, against its intervals."""
    fair_results, rerun = ctx.results.json(FAIR_DENSE), ctx.results.json(FAIR_KERNELS)
    moves, summary = kernel_moves(fair_results, rerun), fair_summary(fair_results)
    rows = []
    for name in dict.fromkeys(m["variant"] for m in moves):
        mine = [m for m in moves if m["variant"] == name]
        rows.append([name, *(f"{signed(m['study'])} / {signed(m['rerun'])}" for m in mine),
                     f"{max(abs(m['moved']) for m in mine):.3f}", f"{summary[name]['half']:.3f}"])
    seeds = sorted({m["seed"] for m in moves})
    header = ["variant", *(f"seed {s}: Δ here / rerun" for s in seeds), "largest move", "95 % half-width (8 seeds)"]
    return "\n\n".join([table(header, rows), kernel_summary(fair_results, rerun) + " " +
                         provenance(rerun, ctx.source(FAIR_KERNELS))])


def kernel_summary(fair_results: dict, rerun: dict) -> str:
    """One paragraph: how far a run and a paired difference moved on the other kernel path, against the
    final runs' interval half-widths."""
    moves, summary = kernel_moves(fair_results, rerun), fair_summary(fair_results)
    if not moves:
        raise ValueError(f"{FAIR_KERNELS} shares no seed with {FAIR_DENSE}")
    capability = lambda r: (r.get("machine") or {}).get("cpu_capability", "?")  # noqa: E731
    largest = max(abs(m["moved"]) for m in moves)
    flips = sum((m["study"] < 0) != (m["rerun"] < 0) for m in moves)
    halves = [e["half"] for e in summary.values() if e["half"] is not None and e["residual"] != "standard"]
    runs = run_moves(fair_results, rerun)
    worst = max(runs, key=lambda m: abs(m["moved"]))
    return (f"On PyTorch's {capability(rerun)} kernels instead of {capability(fair_results)}, a run's own test loss "
            f"moved by up to {abs(worst['moved']):.3f} nats ({worst['variant']}, seed {worst['seed']}: "
            f"{signed(worst['moved'])}), and the paired differences to standard, which take two runs' moves, by up "
            f"to {largest:.3f} ({flips} of {len(moves)} changed sign); the final runs' 95 % half-widths are "
            f"{min(halves):.3f} to {max(halves):.3f}.")


def fair_kernels_summary(ctx) -> str:
    """`kernel_summary` with its source, for pages that link to the table."""
    rerun = ctx.results.json(FAIR_KERNELS)
    return f"{kernel_summary(ctx.results.json(FAIR_DENSE), rerun)} *Source: {ctx.source(FAIR_KERNELS)}.*"


FAIR_LONG, FAIR_PYDOCS = "fair-dense-long/results.json", "fair-pydocs/results.json"


def _compare_diffs(results: dict) -> dict[str, list[float]]:
    """Per variant of an `attnres compare` results.json with test losses: its paired differences to standard."""
    base = next(v for v in results["variants"] if v["residual"] == "standard")
    return {v["name"]: paired_test_difference(v, base) for v in results["variants"] if v is not base}


def _order(diffs: dict[str, list[float]]) -> list[str]:
    return sorted(diffs, key=lambda name: mean(diffs[name]))


def rankings(fair_results: dict, later: dict) -> tuple[list[str], list[str]]:
    """The variants both studies ran, ordered by mean test-loss difference to standard: (in the later
    study, in the fair fight); the two lists are equal when the studies rank them alike."""
    here = {name: e["diffs"] for name, e in fair_summary(fair_results).items() if e["residual"] != "standard"}
    there = _compare_diffs(later)
    return [n for n in _order(there) if n in here], [n for n in _order(here) if n in there]


def shown_better(later: dict) -> list[str]:
    """The variants of a later study whose paired interval to standard lies below 0, best first."""
    diffs = _compare_diffs(later)
    return [name for name in _order(diffs) if mean(diffs[name]) < 0 and excludes_zero(diffs[name])]


def fair_beside(ctx, path: str, what: str) -> str:
    """A later study at the fair fight's chosen rates (`rates_from`) beside the fair fight: each variant's
    paired test-loss difference to standard in both, and whether the two order the variants alike."""
    fair_results, later = ctx.results.json(FAIR_DENSE), ctx.results.json(path)
    here = {name: e["diffs"] for name, e in fair_summary(fair_results).items() if e["residual"] != "standard"}
    there = _compare_diffs(later)
    rows = [[name, f"{later['rates'][name]:.3g}", signed_interval(here[name]), signed_interval(diffs),
             seed_range(diffs), str(len(diffs))] for name, diffs in sorted(there.items(), key=lambda item: mean(item[1]))]
    shared, theirs = rankings(fair_results, later)
    same = shared == theirs
    text = (f"Ordered by their mean difference to standard, the variants rank {'alike' if same else 'differently'} "
            f"in the two: {' < '.join(shared)} {what}" + ("." if same else f", against "
            f"{' < '.join(theirs)} in the fair fight."))
    header = ["variant", "its lr", "Δ, the fair fight (95 % CI)", f"Δ, {what} (95 % CI)", "seeds' range", "seeds"]
    return "\n\n".join([table(header, rows), text + " " + provenance(later, ctx.source(path))])


def verdicts(results: dict) -> dict[str, list[str]]:
    """A protocol study's variants by verdict against standard, each list best first: "best" (one name),
    "better", "worse" (paired 95 % interval excluding 0) and "alike" (including it)."""
    summary = fair_summary(results)
    out = {"best": [], "better": [], "worse": [], "alike": []}
    for name, entry in sorted(summary.items(), key=lambda item: item[1]["mean"]):
        if entry["best"]:
            out["best"].append(name)
        if entry["residual"] != "standard":
            out["better" if entry["excludes_zero"] and entry["mean"] < 0 else
                "worse" if entry["excludes_zero"] else "alike"].append(name)
    return out


def fair_long(ctx) -> str:
    """The fair fight for 4x the steps, beside the fair fight."""
    return fair_beside(ctx, FAIR_LONG, "at 4x the steps")


def fair_pydocs(ctx) -> str:
    """The second corpus, beside the fair fight."""
    return fair_beside(ctx, FAIR_PYDOCS, "on the Python documentation")


def fair_vs_ablation(ctx) -> str:
    """Each variant's difference to standard at one rate for all (the ablation, validation loss) beside the
    fair fight's (each at its own rate, test loss)."""
    ablation, fair_results = ctx.results.json(ABLATION), ctx.results.json(FAIR_DENSE)
    one_rate, own = paired_summary(ablation), fair_summary(fair_results)
    lr = ablation["settings"]["train"]["lr"]
    rows = [[name, signed_interval(one_rate[name]["diffs"]), f"{own[name]['lr']:.3g}", signed_interval(own[name]["diffs"])]
            for name in sorted(own, key=lambda n: own[n]["mean"]) if name in one_rate]
    header = ["variant", f"Δ at lr {lr:g} for all (95 % CI)", "its own lr", "Δ at its own lr (95 % CI)"]
    return "\n\n".join([table(header, rows), f"*Left: {ctx.source(ABLATION)} (validation loss, "
                        f"{len(ablation['seeds'])} seeds); right: {ctx.source(FAIR_DENSE)} (test loss).*"])
