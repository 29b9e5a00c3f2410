"""The ablation on Kimi Linear, the paper's own architecture at CPU scale (results/kimi-linear,
results/kimi-linear-stability: tools/studies/kimi_linear.sh), alone and beside the dense ablation."""

from __future__ import annotations

from tools.pages.ablation import ABLATION, scale_words, step_cell, stability_grid
from tools.pages.costs import FP32, code_path, ratios, shape_words, x
from tools.pages.seeds import (interval, losses_by_seed, paired_difference, seed_range, signed_interval, table,
                                 variants_by_name)
from tools.pages.fair import FAIR_KIMI, fair_summary, verdicts
from tools.pages.sources import ResultMissing, provenance
from attnres.report.compare_report import signed
from attnres.report.document import fmt

KIMI = "kimi-linear/results.json"
# The variants both ablations ran, by the label of the side-by-side table: (dense name, Kimi Linear name).
# Block and Delta Block have S = 4 sub-layers per block in both (16 layers: N = 8; 8 layers: N = 4).
SHARED = {"Full AttnRes": ("full_attnres", "full_attnres"),
          "Block AttnRes, S = 4": ("block_attnres (N=8)", "block_attnres (N=4)"),
          "mHC": ("mhc", "mhc"),
          "Delta Block, S = 4": ("delta_block (N=8)", "delta_block (N=4)")}


def kimi_linear_stability(ctx) -> str:
    """The learning-rate x warm-up grid on the Kimi Linear model."""
    return stability_grid(ctx, "kimi-linear-stability")


def kimi_linear_ablation(ctx) -> str:
    """Every variant against standard on Kimi Linear, paired by seed, with its step cost, its experts'
    balance and its loss spikes."""
    results = ctx.results.json(KIMI)
    variants, summary = variants_by_name(results), results["summary"]
    rows = []
    for name, variant in variants.items():
        entry = summary.get(name, {})
        if name == "standard":
            ours, spread = f"baseline ({interval(list(losses_by_seed(variant).values()))})", "-"
        else:
            diffs = paired_difference(variant, variants["standard"])
            ours, spread = signed_interval(diffs), seed_range(diffs)
        rows.append([name, ours, spread, "1.00x" if name == "standard" else step_cell(entry),
                     fmt(entry.get("expert_imbalance_mean"), ".2f"), fmt(entry.get("loss_spikes_mean"), ".1f")])
    header = ["variant", "Δ vs standard (95 % CI)", "seeds' range", "training step x (90 % CI)",
              "expert imbalance", "loss spikes per run"]
    return "\n\n".join([table(header, rows), provenance(results, ctx.source(KIMI)) +
                        f" Scale: {scale_words(results)}. Expert imbalance: the largest expert's share of a "
                        "layer's held-out assignments over the mean, the largest over layers, mean over seeds "
                        "(1.00: balanced)."])


def ablation_side_by_side(ctx) -> str:
    """The variants both ablations ran: the loss difference to standard and the step cost, dense beside
    Kimi Linear."""
    dense, kimi = ctx.results.json(ABLATION), ctx.results.json(KIMI)
    rows = []
    for label, (dense_name, kimi_name) in SHARED.items():
        cells = [label]
        for results, name in ((dense, dense_name), (kimi, kimi_name)):
            variants = variants_by_name(results)
            if name not in variants:
                cells += ["-", "-"]
                continue
            cells += [signed_interval(paired_difference(variants[name], variants["standard"])),
                      step_cell(results["summary"].get(name, {}))]
        rows.append(cells)
    header = ["variant", "dense: Δ vs standard", "dense: step x", "Kimi Linear: Δ vs standard",
              "Kimi Linear: step x"]
    return table(header, rows) + (f"\n\n*Dense: {ctx.source(ABLATION)} ({scale_words(dense)}). Kimi Linear: "
                                  f"{ctx.source(KIMI)} ({scale_words(kimi)}). Paired by seed, 95 % intervals; "
                                  "step cost interleaved against standard in each run's process.*")


DISPATCH = "moe-dispatch/moe_dispatch.json"


def moe_dispatch(ctx) -> str:
    """The mixture of experts' forward + backward against the dense SwiGLU of equal active width, attnres's
    sorted dispatch and transformers' eager experts (tools/benchmarks/moe_dispatch.py)."""
    results = ctx.results.json(DISPATCH)
    s = results["settings"]
    rows = [[f"{int(tokens):,}", *(f"{results['results'][tokens][name]['median_s'] * 1e3:.1f} ms "
                                   f"({results['results'][tokens][name]['ratio_to_dense']:.2f}x)"
                                   for name in ("dense", "attnres moe", "transformers"))]
            for tokens in results["results"]]
    header = ["tokens", "dense SwiGLU", "attnres experts", "transformers' eager experts"]
    what = (f"Hidden {s['hidden']}, {s['experts']} experts of width {s['expert_size']}, top {s['top_k']}, plus "
            f"{s['shared']} shared, forward and backward, median of {s['rounds']} interleaved rounds; the dense "
            f"SwiGLU has the same active width ({(s['top_k'] + s['shared']) * s['expert_size']}).")
    return "\n\n".join([table(header, rows), what + " " + provenance(results, ctx.source(DISPATCH))])


BENCH = "bench-kimi-linear/bench.json"


def kimi_linear_costs(ctx) -> str:
    """Each variant's training step, memory, prefill and decoding as multiples of standard's on Kimi
    Linear, beside its training step on the dense decoder of the same size (attnres bench, fp32)."""
    kimi, dense = ctx.results.json(BENCH), ctx.results.json(FP32)
    on_kimi, on_dense = ratios(kimi), ratios(dense)
    rows = [[name, x(on_dense.get(name, {}).get("train_step")), x(r.get("train_step")), x(r.get("peak_memory")),
             x(r.get("prefill")), x(r.get("decode_per_token"))] for name, r in on_kimi.items()]
    steps = {label: bench["models"]["variants"]["standard"]["train_step_s"]["median_s"] * 1e3
             for label, bench in (("dense", dense), ("Kimi Linear", kimi))}
    header = ["variant", "train step x, dense", "train step x, Kimi Linear", "peak memory x", "prefill x",
              "decode per token x"]
    return "\n\n".join([table(header, rows),
                        f"*Multiples of `standard` in the same run ({shape_words(kimi)}); standard's fp32 training "
                        f"step took {steps['Kimi Linear']:.0f} ms on Kimi Linear and {steps['dense']:.0f} ms on the "
                        f"dense decoder of the same width and depth. Decoding is eager on both.*",
                        provenance(kimi, ctx.source(BENCH), code_path=code_path(kimi)),
                        provenance(dense, ctx.source(FP32), code_path=code_path(dense))])


def kimi_linear_hyper_connections(ctx) -> str:
    """Hyper-connections against standard on the Kimi Linear stability grid, paired by setting and seed."""
    root = ctx.results.root / "results" / "kimi-linear-stability"
    diffs, at_ablation = [], []
    for path in sorted(p.relative_to(root.parent).as_posix() for p in root.glob("lr*-warmup*/results.json")):
        results = ctx.results.json(path)
        variants = variants_by_name(results)
        if {"standard", "hyper_connections"} <= set(variants):
            pairs = paired_difference(variants["hyper_connections"], variants["standard"])
            diffs += pairs
            train = results["settings"]["train"]
            if (train["lr"], train["warmup_steps"]) == (3e-3, 60):
                at_ablation = pairs
    worse = sum(d > 0 for d in diffs)
    at = ", ".join(signed(d) for d in at_ablation)
    text = (f"Hyper-connections end above standard in {worse} of the grid's {len(diffs)} runs paired by setting and "
            f"seed; at the ablation's setting (lr 3e-3, 60 warm-up steps) by {at} nats: the reverse of their dense "
            f"result. They are not in the ablation below; the fair fight on Kimi Linear (preset `fair_kimi_linear`) "
            f"includes them")
    try:
        results = ctx.results.json(FAIR_KIMI)
        name, entry = next((n, e) for n, e in fair_summary(results).items() if e["residual"] == "hyper_connections")
    except (ResultMissing, StopIteration):
        return text + ". Source: the grid above."
    verdict = next(kind for kind, names in verdicts(results).items() if kind != "best" and name in names)
    return (text + f": at their own best rate ({entry['lr']:g}) they end "
            f"{signed_interval(entry['diffs'])} nats against standard at its own, "
            f"{'not distinguishable' if verdict == 'alike' else verdict}"
            f" by a paired 95 % interval over {len(entry['diffs'])} seeds. Source: the grid above and "
            f"{ctx.source(FAIR_KIMI)}.")
