"""Figures of `attnres analyze`: split routing heatmaps, source cosine matrices and depth line plots.

Same conventions as `attnres.report.plots`: `matplotlib.figure.Figure` objects rendered with Agg
(no pyplot), one PNG per function written atomically through `plots.save_figure` (looked up at call
time, so a test can capture the figures), its path returned; every figure plots.WIDTH wide with its
panels stacked downwards, text no smaller than plots.MIN_FONT_PT, lines in each variant's style
(`styles`). Every axes gets a title and labelled axes; line plots get a legend when they draw more
than one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

from attnres.report import plots
from attnres.report.plots import (MAX_HEATMAP_LABELS, ROW_HEIGHT, STYLE, WIDTH, annotate_cells, draw_heatmap,
                                  heatmap_matrix, label_sources, router_labels, wrapped)

COSINE_ANNOTATE = 9  # cosine panels print their cell values up to this many sources (a WIDTH-wide panel)


def split_routers(num_routers: int) -> tuple[list[int], list[int]]:
    """Router indices of the attention panel (even sub-layers) and the MLP panel (odd sub-layers,
    then the final router where the count is odd: replacement variants route the final hidden state
    last, right after the last MLP, so it is shown as the MLP panel's last row)."""
    has_final = num_routers % 2 == 1
    sublayers = num_routers - has_final
    attention = list(range(0, sublayers, 2))
    mlp = list(range(1, sublayers, 2)) + ([num_routers - 1] if has_final else [])
    return attention, mlp


def plot_routing_heatmap_split(source_names: list[list[str]], mean_weights: list[list[float]], path,
                               title: str, layout: tuple[list[str], str] | None = None) -> Path:
    """Router x source heatmaps of mean routing weight, attention routers and MLP routers apart.

    Two panels, one above the other, on one colour scale [0, 1] and one set of source columns
    (`heatmap_matrix`): on top the routers of attention inputs (even sub-layers), below those of
    MLP inputs (odd sub-layers) with the final router, if any, as the last row. Blank cells are
    sources a router cannot see; the x labels explain the source names shown.
    """
    layout = layout or plots.mixer_rows(source_names)
    if layout[1] != plots.ROUTER_AXIS:
        # Mixers that are not sub-layers' (DenseFormer's averages after layers) have no attention/MLP
        # split: one panel, rows by mixer.
        return plots.plot_routing_heatmap(source_names, mean_weights, path, title, layout)
    columns, matrix = heatmap_matrix(source_names, mean_weights)
    rows, cols = matrix.shape
    labels = router_labels(rows)
    attention, mlp = split_routers(rows)
    panels = [("attention routers", attention), ("MLP routers (+ final)", mlp)]
    heights = [max(len(indices), 2) for _, indices in panels]
    with matplotlib.rc_context(STYLE):
        fig, axes = plots.new_figure(1.0 + sum(2.2 + ROW_HEIGHT * h for h in heights), rows=2,
                                     height_ratios=heights)
        image = None
        for ax, (name, indices) in zip(axes, panels):
            sub = matrix[indices] if indices and cols else np.full((0, cols), np.nan)
            image = draw_heatmap(ax, sub, [labels[i] for i in indices], columns)
            if not indices:
                plots.empty_note(ax, "no routers")
            ax.set(title=name, ylabel="router (sub-layer)")
        label_sources(fig, axes, columns)
        fig.colorbar(image, ax=list(axes), label="mean routing weight", shrink=0.6)
        fig.suptitle(wrapped(title))
        return plots.save_figure(fig, path)


def plot_cosine_matrices(matrices: dict[str, tuple[Sequence[str], Sequence[Sequence[float]]]], path,
                         title: str) -> Path:
    """Token-mean cosine similarity between the sources of a few routers, one panel per router, stacked.

    matrices: panel title (e.g. "router 7 (mlp)") -> (source names, n x n matrix as from
    `collect_source_cosines`). Diverging colour scale on [-1, 1]: 1 = the same direction. Each
    panel is the figure's full width, so cell values are printed up to COSINE_ANNOTATE sources.
    """
    count = max(1, len(matrices))
    side = WIDTH - 1.6  # the square matrix, beside its tick labels and colour bar
    with matplotlib.rc_context(STYLE):
        fig, axes = plots.new_figure(0.8 + count * (side + 1.6), rows=count)
        image = None
        for ax, (name, (names, values)) in zip(axes, matrices.items()):
            ax.grid(False)
            matrix = np.asarray(values, dtype=float).reshape(len(names), len(names))
            image = ax.imshow(matrix, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
            ticks = plots.thinned(len(names), MAX_HEATMAP_LABELS)
            ax.set_xticks(ticks, [names[i] for i in ticks], rotation=90 if len(names) > 8 else 0)
            ax.set_yticks(ticks, [names[i] for i in ticks])
            if len(names) <= COSINE_ANNOTATE:
                annotate_cells(ax, matrix, dark_above=None, light_band=0.6)
            ax.set(title=name, ylabel="source")
        label_sources(fig, axes[:len(matrices)], [n for names, _ in matrices.values() for n in names])
        if not matrices:
            axes[0].grid(False)
            plots.empty_note(axes[0], "no router with two or more sources")
            axes[0].set(title="no routers", xlabel="source", ylabel="source")
        else:
            fig.colorbar(image, ax=list(axes), label="mean cosine similarity", shrink=0.5 if count > 1 else 0.9)
        fig.suptitle(wrapped(title))
        return plots.save_figure(fig, path)


def plot_grad_norms_by_depth(series: dict[str, Sequence[float]], path, title: str,
                             styles: dict[str, dict] | None = None) -> Path:
    """RMS of dLoss/d(sub-layer output) against sub-layer index, one line per series.

    series: name -> 2L values (as `collect_grad_norms`). Logarithmic y axis when values span > 20x.
    """
    return plots.depth_figure(series, path, title, styles, "sub-layer output (even: attention, odd: MLP)",
                              "gradient RMS (per token's loss)", "no values", final=False, log=True)


def plot_entropy_by_depth(entropy: dict[str, Sequence[float | None]],
                          effective: dict[str, Sequence[float | None]], path, title: str,
                          styles: dict[str, dict] | None = None) -> Path:
    """Two panels against router index, one above the other, one line per series: routing entropy
    (nats) and effective number of sources exp(H); one legend for both. None/NaN points
    (single-source routers) are skipped and the x axis starts at the first router with a value."""
    with matplotlib.rc_context(STYLE):
        fig, axes = plots.new_figure(8.0 + 0.25 * ((len(entropy) + 1) // 2), rows=2)
        drawn = 0
        for ax, series, ylabel, name in ((axes[0], entropy, "entropy (nats, token mean)", "routing entropy"),
                                         (axes[1], effective, "effective sources exp(H)",
                                          "effective number of sources")):
            count, _ = plots.draw_lines(ax, series, styles, final=None, empty="no router with an entropy\n"
                                        "(two or more sources, no negative weight)")
            drawn = max(drawn, count)
            if count:
                ax.set_ylim(bottom=0)
            ax.set(title=name, xlabel="router = sub-layer index (even: attention, odd: MLP)", ylabel=ylabel)
        plots.legend(axes[0], drawn)
        fig.suptitle(wrapped(title))
        return plots.save_figure(fig, path)


def plot_causal_routing(routers: Sequence[dict], path, title: str) -> Path:
    """The causal check of one checkpoint (`attnres.analysis.causal`): routing mass against causal effect.

    routers: `RouterCausality.to_dict()` entries. Top panels (one per ablation kind): every (router,
    source) pair as a point, mean routing weight on x, loss change when the source is ablated at that
    router on y, coloured by router index (dark: shallow, light: deep). Bottom panel: each router's
    Spearman rho between mass and effect, one line per ablation kind (None: not drawn).
    """
    kinds = [k for k in ("zero", "mean") if routers and k in routers[0]["effect"]]
    count = max((r["router"] for r in routers), default=0) + 1
    cmap = matplotlib.colormaps["viridis"]
    with matplotlib.rc_context(STYLE):
        fig, axes = plots.new_figure(4.2 * len(kinds) + 4.4, rows=len(kinds) + 1)
        for ax, kind in zip(axes, kinds):
            for r in routers:
                ax.scatter(r["mass"], r["effect"][kind], s=18, color=cmap(r["router"] / max(count - 1, 1)),
                           edgecolors="none")
            ax.axhline(0.0, color="0.6", linewidth=0.8)
            ax.set(title=f"source replaced by {'zero' if kind == 'zero' else 'its token mean'}",
                   xlabel="routing mass (mean weight on the source)", ylabel="loss change (nats/token)")
        norm = matplotlib.colors.Normalize(0, max(count - 1, 1))
        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[:len(kinds)], label="router index")
        ax = axes[-1]
        drawn = 0
        for kind, marker in zip(kinds, ("o", "s")):
            points = [(r["router"], r["rank_correlation"][kind]) for r in routers
                      if r["rank_correlation"][kind] is not None]
            if points:
                ax.plot(*zip(*points), marker=marker, label=f"{kind} ablation")
                drawn += 1
        if not drawn:
            plots.empty_note(ax, "no router with three or more sources and varying mass")
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_ylim(-1.05, 1.05)
        ax.set(title="rank correlation of mass and effect, per router", xlabel="router index",
               ylabel="Spearman rho")
        plots.legend(ax, drawn)
        fig.suptitle(wrapped(title))
        return plots.save_figure(fig, path)
