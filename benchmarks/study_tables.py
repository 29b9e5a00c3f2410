"""Tables and a figure for the reproduction study (docs/study.md) from `attnres compare --preset study`.

Usage: python benchmarks/study_tables.py docs/study
Reads OUT/results.json and writes OUT/tables.md and OUT/figures/num_blocks.png. Every number is
computed from the per-seed runs in results.json: intervals are Student-t 95 % intervals over seeds;
differences against standard are paired by seed (same seed = same initial weights of the shared
sub-layers and the same data order), which removes most seed-to-seed noise.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from attnres.analysis.intervals import ci95_halfwidth
from attnres.report.compare_report import signed
from attnres.report.document import fmt

MAIN = ["standard", "full_attnres", "block_attnres (N=8)", "delta_attnres", "delta_block (N=8)"]
DEEP_FRACTION = 1 / 3


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def interval(values: list[float], spec: str = ".3f") -> str:
    """'mean ± half-width' of a 95 % interval (the mean alone for one value)."""
    half = ci95_halfwidth(values)
    return fmt(mean(values), spec) if half is None else f"{fmt(mean(values), spec)} ± {fmt(half, spec)}"


def signed_interval(values: list[float]) -> str:
    """'+mean ± half-width' of a 95 % interval of differences (the signed mean alone for one value)."""
    half = ci95_halfwidth(values)
    return signed(mean(values)) if half is None else f"{signed(mean(values))} ± {half:.3f}"


def losses_by_seed(variant: dict) -> dict[int, float]:
    return {run["seed"]: float(run["final_val_loss"]) for run in variant["runs"]}


def paired_by_seed(variant: dict, reference: dict) -> dict[int, float]:
    """Seed -> variant's final val loss minus the reference's, for the seeds present in both, in order."""
    mine, theirs = losses_by_seed(variant), losses_by_seed(reference)
    return {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}


def paired_difference(variant: dict, reference: dict) -> list[float]:
    """Per seed present in both: variant's final val loss minus the reference's."""
    return list(paired_by_seed(variant, reference).values())


def deep_routers(stats: dict) -> list[int]:
    """Indices of the deepest third of multi-source routers (the compare report's selection)."""
    multi = [i for i, m in enumerate(stats["max_weight"]) if m is not None]
    return multi[len(multi) - max(1, round(len(multi) * DEEP_FRACTION)):] if multi else []


def deep_routing(run: dict) -> dict[str, float] | None:
    """Over the deepest third of multi-source routers of one run: mean max weight, mean weight of
    the embedding source, mean uniform weight 1/n and mean effective sources."""
    stats = run["depth_stats"]
    chosen = deep_routers(stats)
    if not chosen:
        return None
    return {"max_weight": mean([stats["max_weight"][i] for i in chosen]),
            "embedding_weight": mean([stats["mean_weights"][i][0] for i in chosen]),
            "uniform": mean([1 / len(stats["source_names"][i]) for i in chosen]),
            "effective_sources": mean([stats["effective_sources"][i] for i in chosen])
            if stats.get("effective_sources") else math.nan}


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def loss_rows(names: list[str], variants: dict[str, dict], reference: str = "standard") -> list[list[str]]:
    """One row per variant: seeds, loss and perplexity intervals, and the loss difference against
    `reference` paired by seed; no rows when `reference` was not run."""
    if reference not in variants:
        return []
    base = variants[reference]
    rows = []
    for name in names:
        if name not in variants:
            continue
        variant = variants[name]
        losses = list(losses_by_seed(variant).values())
        ppl = [math.exp(x) for x in losses]
        rows.append([name, str(len(losses)), interval(losses), interval(ppl, ".2f"),
                     "baseline" if name == reference else signed_interval(paired_difference(variant, base))])
    return rows


LOSS_HEADER = ["variant", "seeds", "val loss (95% CI)", "val perplexity (95% CI)", "Δ loss vs standard, paired (95% CI)"]


def routing_rows(names: list[str], variants: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name in names:
        if name not in variants or name == "standard":
            continue
        per_seed = [d for d in map(deep_routing, variants[name]["runs"]) if d is not None]
        if not per_seed:
            continue
        rows.append([name, interval([d["max_weight"] for d in per_seed]), fmt(mean([d["uniform"] for d in per_seed]), ".3f"),
                     interval([d["effective_sources"] for d in per_seed], ".2f"),
                     interval([d["embedding_weight"] for d in per_seed])])
    return rows


ROUTING_HEADER = ["variant", "max weight, deepest third (95% CI)", "uniform 1/n there", "effective sources",
                  "weight on the embedding"]


def plot_num_blocks(variants: dict[str, dict], path: Path) -> None:
    """Validation-loss difference to standard (paired by seed) against the number of blocks, Block
    AttnRes and Delta Block; error bars are 95 % intervals of the paired mean. Each point is drawn in
    its variant's style (`attnres.report.style`, as in every report) on a line of its residual's colour."""
    import matplotlib

    from attnres.report import plots
    from attnres.report.style import variant_style

    with matplotlib.rc_context(plots.STYLE):
        fig, (ax,) = plots.new_figure(5.0)
        ax.axhline(0.0, label="standard", **{**variant_style("standard"), "marker": None, "linewidth": 1})
        for residual, shift in (("block_attnres", 0.97), ("delta_block", 1.03)):
            points = []
            for n in (1, 2, 4, 8):
                name = f"{residual} (N={n})"
                if name in variants:
                    diffs = paired_difference(variants[name], variants["standard"])
                    points.append((n, n * shift, mean(diffs), ci95_halfwidth(diffs) or 0.0))
            if not points:
                continue
            _, xs, ys, _ = zip(*points)
            ax.plot(xs, ys, color=variant_style(residual)["color"], linewidth=1.5, label=residual)
            for n, x, y, error in points:
                style = variant_style(residual, num_blocks=n)
                ax.errorbar([x], [y], yerr=[error], capsize=3, markersize=plots.MARKER_SIZE + 2, linestyle="none",
                            color=style["color"], marker=style["marker"], markerfacecolor=style["markerfacecolor"],
                            markeredgecolor=style["color"])
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set(xlabel="number of blocks N", ylabel="Δ validation loss vs standard (nats)",
               title=plots.wrapped("Block count, paired by seed (below 0: better than standard)"))
        plots.legend(ax, len(ax.get_legend_handles_labels()[1]))
        plots.save_figure(fig, path)


def main(out: Path) -> None:
    results = json.loads((out / "results.json").read_text())
    variants = {v["name"]: v for v in results["variants"]}
    blocks = [f"{r} (N={n})" for r in ("block_attnres", "delta_block") for n in (1, 2, 4, 8)]
    init = ["block_attnres (N=8)", "block_attnres (N=8) [q~N(0,0.02)]", "delta_block (N=8)",
            "delta_block (N=8) [q~N(0,0.02)]"]
    sections = [
        "# Study tables (generated by benchmarks/study_tables.py from results.json)",
        "## 1. Every variant", table(LOSS_HEADER, loss_rows(MAIN, variants)),
        "## 2. Routing in the deepest third of routers", table(ROUTING_HEADER, routing_rows(MAIN, variants)),
        "## 3. Delta Block with one block (re-adds the embedding only)",
        table(LOSS_HEADER, loss_rows(["standard", "delta_block (N=1)", "delta_block (N=8)"], variants)),
        "## 4. Router-query initialisation: zero against N(0, 0.02)",
        table(LOSS_HEADER, loss_rows(["standard"] + init, variants)),
        "Against the same variant with zero queries (paired by seed):",
        table(LOSS_HEADER[:-1] + ["Δ loss vs zero queries, paired (95% CI)"],
              loss_rows(init[:2], variants, reference=init[0]) + loss_rows(init[2:], variants, reference=init[2])),
        table(ROUTING_HEADER, routing_rows(init, variants)),
        "## 5. Number of blocks", table(LOSS_HEADER, loss_rows(["standard"] + blocks, variants)),
        table(ROUTING_HEADER, routing_rows(blocks, variants)),
        "![validation loss difference to standard against the number of blocks](figures/num_blocks.png)",
    ]
    if "standard" in variants:
        plot_num_blocks(variants, out / "figures" / "num_blocks.png")
    (out / "tables.md").write_text("\n\n".join(sections) + "\n")
    print(f"wrote {out / 'tables.md'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/study"))
