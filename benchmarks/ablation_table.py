"""The Kimi ablation table in direction (docs/ablation.md) from `attnres compare --preset ablation`.

Usage: python benchmarks/ablation_table.py docs/ablation-study [--probe docs/ablation-probe]
Reads OUT/results.json (and, when present, OUT/analyze/analysis.json from `attnres analyze --causal`)
and writes OUT/table.md: every variant's validation loss next to the Kimi paper's (METHOD §6), its
difference to standard paired by seed with a Student-t 95 % interval and the seeds' spread, whether
its direction agrees with the paper's, its training-step cost from the interleaved measurement, its
loss spikes; the router ablations against Full AttnRes; the causal-routing summary; and, with
--probe, the same paired differences on another floating-point path (scripts/ablation_probe.sh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from study_tables import interval, losses_by_seed, mean, paired_by_seed, paired_difference, signed_interval, table  # benchmarks/ on the path

from attnres.analysis.intervals import ci95_halfwidth, sample_std
from attnres.model.config import ModelConfig
from attnres.model.flops import flops_per_token
from attnres.report.compare_report import signed
from attnres.report.document import fmt

# Kimi's 16-layer ablation (METHOD §6): validation loss per variant, by attnres variant name.
KIMI = {"standard": 1.766, "denseformer": 1.767, "mhc": 1.747, "full_attnres": 1.737,
        "full_attnres [input query]": 1.731, "full_attnres [sigmoid]": 1.741, "full_attnres [no key norm]": 1.743,
        "block_attnres (N=8)": 1.746}
KIMI_NAMES = {"standard": "baseline", "denseformer": "DenseFormer", "mhc": "mHC", "full_attnres": "Full AttnRes",
              "full_attnres [input query]": "input-dependent query", "full_attnres [sigmoid]": "sigmoid",
              "full_attnres [no key norm]": "no key RMSNorm", "block_attnres (N=8)": "Block, S = 4"}
NO_DIFFERENCE = 0.002  # a paper difference below this (DenseFormer's +0.001 nats) is read as "no difference"
ROUTER_ABLATIONS = ["full_attnres [input query]", "full_attnres [sigmoid]", "full_attnres [no key norm]",
                    "block_attnres (N=8)", "mhc"]


def direction(diffs: list[float], paper: float | None) -> str:
    """Whether the paired differences `diffs` (variant minus reference, per seed) agree in sign with
    the paper's difference `paper`: "agrees", "opposite", or "unresolved" when the 95 % interval
    holds 0 (or "agrees" then, when the paper too finds no difference); "-" without a paper number."""
    if paper is None:
        return "-"
    half = ci95_halfwidth(diffs)
    m = mean(diffs)
    resolved = half is not None and abs(m) > half
    if abs(paper) < NO_DIFFERENCE:
        return "opposite" if resolved else "agrees (no difference)"
    if not resolved:
        return "unresolved"
    return "agrees" if (m > 0) == (paper > 0) else "opposite"


def spread(diffs: list[float]) -> str:
    """The seeds' standard deviation of the paired differences and their range."""
    if len(diffs) < 2:
        return "-"
    return f"{sample_std(diffs):.3f} ({min(diffs):+.3f} to {max(diffs):+.3f})"


def cost_cell(entry: dict) -> str:
    """The interleaved median step ratio to standard with its 90 % interval, "noisy" when too wide."""
    ratio = entry.get("step_time_ratio")
    if ratio is None:
        return "-"
    if entry.get("step_time_noisy"):
        return f"noisy ({fmt(ratio, '.2f')}×)"
    return f"{ratio:.2f}× ({entry['step_time_low']:.2f}–{entry['step_time_high']:.2f})"


def flops_ratios(results: dict) -> dict[str, float]:
    """Per variant: training FLOPs per token over standard's (attnres.model.flops), from the models of
    the cost measurement at the run's sequence length; empty without a cost measurement."""
    models = {name: entry["model"] for name, entry in (results.get("cost") or {}).get("variants", {}).items()}
    if "standard" not in models:
        return {}
    seq_len = results["settings"]["train"]["seq_len"]
    flops = {name: flops_per_token(ModelConfig.from_dict(model), seq_len).training for name, model in models.items()}
    return {name: value / flops["standard"] for name, value in flops.items()}


def main_rows(variants: dict[str, dict], summary: dict, flops: dict[str, float]) -> list[list[str]]:
    """One row per variant: the paper's loss and difference, ours with intervals, the verdict, cost
    (FLOPs and measured time), spikes."""
    base = variants["standard"]
    rows = []
    for name, variant in variants.items():
        losses = list(losses_by_seed(variant).values())
        paper = KIMI.get(name)
        paper_diff = None if paper is None or name == "standard" else paper - KIMI["standard"]
        entry = summary.get(name, {})
        if name == "standard":
            ours, verdict, seeds_spread = "baseline", "-", "-"
        else:
            diffs = paired_difference(variant, base)
            ours, verdict, seeds_spread = signed_interval(diffs), direction(diffs, paper_diff), spread(diffs)
        rows.append([name, KIMI_NAMES.get(name, "-"), fmt(paper, ".3f"), "-" if paper_diff is None else signed(paper_diff),
                     str(len(losses)), interval(losses), ours, seeds_spread, verdict,
                     fmt(flops.get(name), ".3f", "×"), "baseline" if name == "standard" else cost_cell(entry),
                     fmt(entry.get("loss_spikes_mean"), ".1f")])
    return rows


MAIN_HEADER = ["variant", "Kimi's name", "Kimi val loss", "Kimi Δ vs baseline", "seeds", "val loss (95% CI)",
               "Δ vs standard, paired (95% CI)", "seed sd of Δ (range)", "direction vs Kimi", "FLOPs × standard",
               "train step × standard (90% CI)",
               "loss spikes per run"]


def against_full_rows(variants: dict[str, dict]) -> list[list[str]]:
    """The router ablations, Block S = 4 and mHC against Full AttnRes, paired by seed, beside Kimi's."""
    if "full_attnres" not in variants:
        return []
    rows = []
    for name in ROUTER_ABLATIONS:
        if name not in variants:
            continue
        diffs = paired_difference(variants[name], variants["full_attnres"])
        paper = KIMI[name] - KIMI["full_attnres"]
        rows.append([name, signed(paper), signed_interval(diffs), spread(diffs), direction(diffs, paper)])
    return rows


FULL_HEADER = ["variant", "Kimi Δ vs Full AttnRes", "Δ vs full_attnres, paired (95% CI)", "seed sd of Δ (range)",
               "direction vs Kimi"]


def causal_rows(analysis: dict) -> list[list[str]]:
    """Per analysed checkpoint: held-out loss, and per ablation kind the mean Spearman rho between
    routing mass and causal effect over routers, with how many routers are positive."""
    rows = []
    for checkpoint in analysis["checkpoints"]:
        causal = checkpoint.get("causal")
        if not causal:
            continue
        cells = []
        for kind in ("zero", "mean"):
            s = causal["summary"].get(kind)
            cells.append("-" if not s or s["mean_rank_correlation"] is None else
                         f"{s['mean_rank_correlation']:+.2f} ({s['positive']}/{s['routers']} positive)")
        rows.append([checkpoint["label"], fmt(causal["clean_loss"], ".3f"), *cells])
    return rows


CAUSAL_HEADER = ["checkpoint (seed 0)", "held-out loss", "rho(mass, effect), zero ablation", "rho, token-mean ablation"]


def probe_rows(variants: dict[str, dict], probe: dict[str, dict]) -> list[list[str]]:
    """Per probed variant and seed: the paired difference to standard on this study's floating-point
    path and on the probe's, the change, and the change in units of the study's seed standard
    deviation of that paired difference (how far the other path moves it, against how far another
    seed does); then standard's own losses on both paths."""
    rows = []
    for name, variant in probe.items():
        if name == "standard" or name not in variants:
            continue
        study = paired_by_seed(variants[name], variants["standard"])
        other = paired_by_seed(variant, probe["standard"])
        sd = sample_std(list(study.values())) if len(study) > 1 else None
        for seed in sorted(set(study) & set(other)):
            change = other[seed] - study[seed]
            rows.append([name, str(seed), signed(study[seed]), signed(other[seed]), signed(change),
                         "-" if not sd else f"{abs(change) / sd:.1f}"])
    standard, probed = losses_by_seed(variants["standard"]), losses_by_seed(probe.get("standard", {"runs": []}))
    for seed in sorted(set(standard) & set(probed)):
        rows.append(["standard (its loss)", str(seed), fmt(standard[seed], ".4f"), fmt(probed[seed], ".4f"),
                     signed(probed[seed] - standard[seed]), "-"])
    return rows


PROBE_HEADER = ["variant", "seed", "Δ vs standard, study's path", "Δ vs standard, probe's path", "change",
                "|change| / seed sd of Δ"]


def variants_of(path: Path) -> tuple[dict, dict]:
    results = json.loads((path / "results.json").read_text())
    return {v["name"]: v for v in results["variants"]}, results


def main(out: Path, probe_dir: Path | None) -> None:
    variants, results = variants_of(out)
    machine = results["machine"]
    sections = [
        "# Ablation table (generated by benchmarks/ablation_table.py from results.json)",
        f"From `{results['command']}` on {machine['device_name']} ({machine['cpu_count']} cores, "
        f"{machine.get('cpu_capability', '?')} kernels), torch {machine['torch']}. Differences are final "
        "validation loss minus standard's on the same seed; intervals are Student-t 95 % over seeds. "
        "'unresolved': the interval holds 0. FLOPs: training FLOPs per token over standard's "
        "(attnres.model.flops, docs/scaling.md). Train step: the median over interleaved rounds of the "
        "measured step-time ratio to standard, with its distribution-free 90 % interval.",
        "## 1. Every variant against standard", table(MAIN_HEADER, main_rows(variants, results["summary"], flops_ratios(results))),
        "## 2. Against Full AttnRes (the paper's router ablations)", table(FULL_HEADER, against_full_rows(variants)),
    ]
    analysis_path = out / "analyze" / "analysis.json"
    if analysis_path.is_file():
        sections += ["## 3. Causal check of routing (attnres analyze --causal)",
                     "Spearman's rho, per router, between a source's routing mass and the held-out loss increase "
                     "when it is ablated; the mean over routers, and how many routers have rho > 0.",
                     table(CAUSAL_HEADER, causal_rows(json.loads(analysis_path.read_text())))]
    if probe_dir is not None:
        probe, probe_results = variants_of(probe_dir)
        sections += ["## 4. Another floating-point path (scripts/ablation_probe.sh)",
                     f"The probe: `{probe_results['command']}` with PyTorch's "
                     f"{probe_results['machine'].get('cpu_capability', '?')} kernels, same machine, data and seeds.",
                     table(PROBE_HEADER, probe_rows(variants, probe))]
    (out / "table.md").write_text("\n\n".join(sections) + "\n")
    print(f"wrote {out / 'table.md'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path("docs/ablation-study"))
    parser.add_argument("--probe", type=Path, default=None, help="a scripts/ablation_probe.sh output folder")
    args = parser.parse_args()
    main(args.out, args.probe)
