"""The block-count figure of the reproduction study (docs/explanation/study.md) from its results.json.

Usage: python tools/benchmarks/study_figure.py results/study
Writes OUT/figures/num_blocks.png: the validation-loss difference to standard, paired by seed, against the
number of blocks for Block AttnRes and Delta Block, with 95 % intervals. The study's tables are generated
into the page itself (`python -m tools.pages`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Run as a file from anywhere: the page helpers it shares are the repository's tools/, not the library's.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attnres.analysis.intervals import ci95_halfwidth, mean
from tools.pages.seeds import paired_difference, variants_by_name


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
                style = variant_style(residual, size=n)
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
    variants = variants_by_name(json.loads((out / "results.json").read_text()))
    if "standard" in variants:
        plot_num_blocks(variants, out / "figures" / "num_blocks.png")
        print(f"wrote {out / 'figures' / 'num_blocks.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/study"))
