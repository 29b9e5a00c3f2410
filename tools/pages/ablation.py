"""The Kimi ablation reproduced in direction (results/ablation, results/ablation-probe, results/stability):
each variant's loss difference to standard paired by seed, beside the paper's, with FLOPs and step cost."""

from __future__ import annotations

import re

from attnres.analysis.intervals import ci95_halfwidth, mean
from attnres.common.errors import InputError
from tools.pages.published import kimi_ablation
from tools.pages.seeds import (
    excludes_zero, interval, losses_by_seed, paired_by_seed, paired_difference, seed_range, seed_sd,
    signed_interval, table, variants_by_name)
from tools.pages.sources import provenance
from attnres.report.compare_report import signed
from attnres.report.document import fmt

ABLATION = "ablation/results.json"
PROBE = "ablation-probe/results.json"
CAUSAL = "ablation/analyze/analysis.json"
NO_DIFFERENCE = 0.002  # a paper difference below this (DenseFormer's) reads as "no difference"
AGAINST_FULL = ["full_attnres [input query]", "full_attnres [sigmoid]", "full_attnres [no key norm]",
                "block_attnres (N=8)", "mhc"]


def direction(diffs: list[float], paper: float | None) -> str:
    """Whether paired differences agree in sign with the paper's difference: "agrees", "opposite", or
    "unresolved" when their 95 % interval holds 0 (or "agrees (no difference)" when the paper too
    finds none); "-" without a paper figure."""
    if paper is None:
        return "-"
    resolved = excludes_zero(diffs)
    if abs(paper) < NO_DIFFERENCE:
        return "opposite" if resolved else "agrees (no difference)"
    if not resolved:
        return "unresolved"
    return "agrees" if (mean(diffs) > 0) == (paper > 0) else "opposite"


def step_cell(entry: dict) -> str:
    """The interleaved median step ratio to standard with its 90 % interval ("noisy" when too wide)."""
    ratio = entry.get("step_time_ratio")
    if ratio is None:
        return "-"
    if entry.get("step_time_noisy"):
        return f"noisy ({ratio:.2f}x)"
    return f"{ratio:.2f}x ({entry['step_time_low']:.2f}-{entry['step_time_high']:.2f})"


def paired_summary(results: dict) -> dict[str, dict]:
    """Per variant other than standard: its paired differences, their mean, 95 % half-width and whether
    the interval excludes 0 (for the recommendation)."""
    variants = variants_by_name(results)
    base = variants["standard"]
    out = {}
    for name, variant in variants.items():
        if name != "standard":
            diffs = paired_difference(variant, base)
            out[name] = {"diffs": diffs, "mean": mean(diffs), "half": ci95_halfwidth(diffs),
                         "excludes_zero": excludes_zero(diffs), "seeds": len(diffs)}
    return out


def scale_words(results: dict) -> str:
    """'16 layers x 64 wide (0.92M parameters), 240 steps of 8 x 128 tokens, 3 seeds'."""
    model, train = results["settings"]["model"], results["settings"]["train"]
    params = (results.get("cost") or {}).get("variants", {}).get("standard", {}).get("parameters")
    size = f" ({params / 1e6:.2f}M parameters)" if params else ""
    return (f"{model['num_layers']} layers x {model['hidden_size']} wide{size}, {train['steps']} steps of "
            f"{train['batch_size']} x {train['seq_len']} tokens, {len(results['seeds'])} seed{'s' if len(results['seeds']) != 1 else ''}")


def ablation_table(ctx) -> str:
    """Every variant of the ablation against standard, beside Kimi's difference to its baseline."""
    results = ctx.results.json(ABLATION)
    variants, summary = variants_by_name(results), results["summary"]
    kimi = kimi_ablation(ctx.results)
    rows = []
    for name, variant in variants.items():
        entry = summary.get(name, {})
        paper = None if name == "standard" or name not in kimi else kimi[name] - kimi["standard"]
        if name == "standard":
            ours, spread, verdict = f"baseline ({interval(list(losses_by_seed(variant).values()))})", "-", "-"
        else:
            diffs = paired_difference(variant, variants["standard"])
            ours, spread, verdict = signed_interval(diffs), seed_range(diffs), direction(diffs, paper)
        rows.append([name, "-" if paper is None else signed(paper), ours, spread, verdict,
                     "1.00x" if name == "standard" else step_cell(entry), fmt(entry.get("loss_spikes_mean"), ".1f")])
    header = ["variant", "Kimi: Δ vs baseline", "Δ vs standard here (95 % CI)", "seeds' range", "direction",
              "training step x (90 % CI)", "loss spikes per run"]
    return "\n\n".join([table(header, rows), provenance(results, ctx.source(ABLATION)) +
                        f" Scale: {scale_words(results)}; Kimi's figures: {ctx.source('published/published.json')}."])


def ablation_vs_full(ctx) -> str:
    """The router ablations, Block S = 4 and mHC against Full AttnRes, paired by seed, beside Kimi's."""
    results = ctx.results.json(ABLATION)
    variants, kimi = variants_by_name(results), kimi_ablation(ctx.results)
    rows = []
    for name in AGAINST_FULL:
        if name in variants and name in kimi:
            diffs = paired_difference(variants[name], variants["full_attnres"])
            paper = kimi[name] - kimi["full_attnres"]
            rows.append([name, signed(paper), signed_interval(diffs), seed_range(diffs), direction(diffs, paper)])
    header = ["variant", "Kimi: Δ vs Full", "Δ vs full_attnres here (95 % CI)", "seeds' range", "direction"]
    return table(header, rows) + f"\n\n*From {ctx.source(ABLATION)}, paired by seed as above.*"


def ablation_causal(ctx) -> str:
    """The causal check: Spearman's rho between routing mass and the loss increase of ablating a source."""
    analysis = ctx.results.json(CAUSAL)
    rows = []
    for checkpoint in analysis["checkpoints"]:
        causal = checkpoint.get("causal")
        if not causal:
            continue
        cells = []
        for kind in ("zero", "mean"):
            s = causal["summary"].get(kind)
            cells.append("-" if not s or s["mean_rank_correlation"] is None else
                         f"{s['mean_rank_correlation']:+.2f} ({s['positive']}/{s['routers']})")
        rows.append([checkpoint["label"], *cells])
    header = ["checkpoint (seed 0)", "zero ablation: mean rho (routers with rho > 0)", "token-mean ablation"]
    command = analysis.get("command")
    by = f" by `{command}`" if command else ""
    return table(header, rows) + f"\n\n*Computed{by}. Source: {ctx.source(CAUSAL)}.*"


def ablation_probe(ctx) -> str:
    """Paired differences on another floating-point path (the probe) beside the ablation's."""
    results, probe = ctx.results.json(ABLATION), ctx.results.json(PROBE)
    variants, probed = variants_by_name(results), variants_by_name(probe)
    rows = []
    for name, variant in probed.items():
        if name == "standard" or name not in variants:
            continue
        here = paired_by_seed(variants[name], variants["standard"])
        there = paired_by_seed(variant, probed["standard"])
        sd = seed_sd(list(here.values()))
        for seed in sorted(set(here) & set(there)):
            change = there[seed] - here[seed]
            rows.append([name, str(seed), signed(here[seed]), signed(there[seed]), signed(change),
                         "-" if not sd else f"{abs(change) / sd:.1f}"])
    base, base_probe = losses_by_seed(variants["standard"]), losses_by_seed(probed["standard"])
    for seed in sorted(set(base) & set(base_probe)):
        rows.append(["standard (its loss)", str(seed), f"{base[seed]:.3f}", f"{base_probe[seed]:.3f}",
                     signed(base_probe[seed] - base[seed]), "-"])
    header = ["variant", "seed", "Δ vs standard, ablation's path", "Δ, probe's path", "change",
              "change / seeds' sd of Δ"]
    return "\n\n".join([table(header, rows), provenance(probe, ctx.source(PROBE))])


def _grid_order(path: str) -> tuple[float, int]:
    lr, warmup = re.search(r"lr(.+)-warmup(\d+)/", path).groups()
    return float(lr), int(warmup)


def stability_table(ctx) -> str:
    """The learning-rate x warm-up grid before the ablation: losses over seeds and divergence events."""
    return stability_grid(ctx, "stability")


def stability_grid(ctx, folder: str) -> str:
    """The learning-rate x warm-up grid of tools/studies/stability.sh in results/`folder`: losses over seeds and
    divergence events per setting and variant."""
    root = ctx.results.root / "results" / folder
    paths = sorted((p.relative_to(root.parent).as_posix() for p in root.glob("lr*-warmup*/results.json")),
                   key=_grid_order)
    if not paths:
        raise InputError(f"results/{folder} has no lr*-warmup*/results.json")
    rows, first = [], None
    for path in paths:
        results = ctx.results.json(path)
        first = first or results
        train = results["settings"]["train"]
        for variant in results["variants"]:
            runs = sorted(variant["runs"], key=lambda r: r["seed"])
            events = [r.get("stability") or {} for r in runs]
            rows.append([f"{train['lr']:g}", str(train.get("warmup_steps", "-")), variant["name"],
                         interval([float(r["final_val_loss"]) for r in runs]),
                         ", ".join(str(e.get("loss_spikes", "-")) for e in events),
                         ", ".join(str(e.get("grad_spikes", "-")) for e in events),
                         ", ".join(format(e["clip_rate"], ".0%") if "clip_rate" in e else "-" for e in events)])
    header = ["lr", "warm-up", "variant", "val loss (95 % CI)", "loss spikes per seed", "grad-norm spikes",
              "clipped steps"]
    return "\n\n".join([table(header, rows), provenance(first, f"{ctx.source(paths[0])} and the other "
                                                        f"`results/{folder}/lr*-warmup*/results.json`")])
