"""Figures of `attnres analyze`: split routing heatmaps, source cosine matrices and depth line plots.

Same conventions as `attnres.report.plots`: `matplotlib.figure.Figure` objects rendered with Agg
(no pyplot), one PNG per function written atomically through `plots.save_figure` (looked up at call
time, so a test can capture the figures), its path returned. Every axes gets a title and labelled
axes; line plots get a legend when they draw more than one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from attnres.report import plots
from attnres.report.plots import MAX_HEATMAP_LABELS, STYLE, heatmap_matrix, router_labels

SOURCE_AXIS = "source (e = embedding, p = current partial)"


def split_routers(num_routers: int) -> tuple[list[int], list[int]]:
    """Router indices of the attention panel (even sub-layers) and the MLP panel (odd sub-layers,
    then the final router where the count is odd: replacement variants route the final hidden state
    last, right after the last MLP, so it is shown as the MLP panel's last row)."""
    has_final = num_routers % 2 == 1
    sublayers = num_routers - has_final
    attention = list(range(0, sublayers, 2))
    mlp = list(range(1, sublayers, 2)) + ([num_routers - 1] if has_final else [])
    return attention, mlp


def _annotate(ax, matrix: np.ndarray, spec: str, dark_above: float | None, light_band: float | None = None) -> None:
    """Print each finite cell's value; black text on bright cells, white on dark ones."""
    for r, c in zip(*np.nonzero(~np.isnan(matrix))):
        value = matrix[r, c]
        if dark_above is not None:
            color = "black" if value > dark_above else "white"
        else:  # diverging map: pale near zero, dark at both ends
            color = "black" if abs(value) < light_band else "white"
        ax.text(c, r, format(value, spec), ha="center", va="center", fontsize=7, color=color)


def plot_routing_heatmap_split(source_names: list[list[str]], mean_weights: list[list[float]], path,
                               title: str) -> Path:
    """Router x source heatmaps of mean routing weight, attention routers and MLP routers apart.

    Two panels side by side on one colour scale [0, 1] and one set of source columns
    (`heatmap_matrix`): left the routers of attention inputs (even sub-layers), right those of MLP
    inputs (odd sub-layers) with the final router, if any, as the last row. Blank cells are sources
    a router cannot see.
    """
    columns, matrix = heatmap_matrix(source_names, mean_weights)
    rows, cols = matrix.shape
    labels = router_labels(rows)
    panels = [("attention routers", split_routers(rows)[0]), ("MLP routers (+ final)", split_routers(rows)[1])]
    panel_rows = max(1, max(len(idx) for _, idx in panels))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(min(20, max(10, 4 + 0.6 * cols)), min(13, max(4.5, 2.2 + 0.3 * panel_rows))),
                     layout="constrained")
        axes = fig.subplots(1, 2, squeeze=False)[0]
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
        image = None
        for ax, (name, indices) in zip(axes, panels):
            ax.grid(False)
            sub = matrix[indices] if indices and cols else np.full((1, max(cols, 1)), np.nan)
            image = ax.imshow(np.ma.masked_invalid(sub), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                              interpolation="nearest")
            row_ticks = plots.thinned(len(indices), MAX_HEATMAP_LABELS)
            col_ticks = plots.thinned(cols, MAX_HEATMAP_LABELS)
            ax.set_yticks(row_ticks, [labels[indices[i]] for i in row_ticks])
            ax.set_xticks(col_ticks, [columns[j] for j in col_ticks], rotation=90 if cols > 12 else 0)
            if indices and len(indices) <= 24 and cols <= 14:
                _annotate(ax, sub, ".2f", dark_above=0.6)
            if not indices:
                plots.empty_note(ax, "no routers")
            ax.set(title=name, xlabel=SOURCE_AXIS, ylabel="router (sub-layer)")
        fig.colorbar(image, ax=list(axes), label="mean routing weight")
        fig.suptitle(title)
        return plots.save_figure(fig, path)


def plot_cosine_matrices(matrices: dict[str, tuple[Sequence[str], Sequence[Sequence[float]]]], path,
                         title: str) -> Path:
    """Token-mean cosine similarity between the sources of a few routers, one panel per router.

    matrices: panel title (e.g. "router 7 (mlp)") -> (source names, n x n matrix as from
    `collect_source_cosines`). Diverging colour scale on [-1, 1]: 1 = the same direction.
    """
    count = max(1, len(matrices))
    largest = max((len(names) for names, _ in matrices.values()), default=1)
    side = min(7.0, max(3.6, 1.6 + 0.35 * largest))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(min(24, side * count + 1.2), side + 0.8), layout="constrained")
        axes = fig.subplots(1, count, squeeze=False)[0]
        image = None
        for ax, (name, (names, values)) in zip(axes, matrices.items()):
            ax.grid(False)
            matrix = np.asarray(values, dtype=float).reshape(len(names), len(names))
            image = ax.imshow(matrix, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
            ticks = plots.thinned(len(names), MAX_HEATMAP_LABELS)
            ax.set_xticks(ticks, [names[i] for i in ticks], rotation=90 if len(names) > 12 else 0)
            ax.set_yticks(ticks, [names[i] for i in ticks])
            if len(names) <= 12:
                _annotate(ax, matrix, ".2f", dark_above=None, light_band=0.6)
            ax.set(title=name, xlabel="source", ylabel="source")
        if not matrices:
            axes[0].grid(False)
            plots.empty_note(axes[0], "no router with two or more sources")
            axes[0].set(title="no routers", xlabel="source", ylabel="source")
        else:
            fig.colorbar(image, ax=list(axes), label="mean cosine similarity", shrink=0.9)
        fig.suptitle(title)
        return plots.save_figure(fig, path)


def plot_grad_norms_by_depth(series: dict[str, Sequence[float]], path, title: str) -> Path:
    """RMS of dLoss/d(sub-layer output) against sub-layer index, one line per series.

    series: name -> 2L values (as `collect_grad_norms`). Logarithmic y axis when values span > 20x.
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8, 5), layout="constrained")
        ax = fig.add_subplot()
        drawn, longest, values = plots.draw_lines(ax, series)
        if drawn:
            plots.integer_ticks(ax, longest)
            plots.log_scale_if_wide(ax, values)
        else:
            plots.empty_note(ax, "no values")
        ax.set(title=title, xlabel="sub-layer output (even: attention, odd: MLP)",
               ylabel="gradient RMS (per token's loss)")
        plots.legend(ax, drawn)
        return plots.save_figure(fig, path)


def plot_entropy_by_depth(entropy: dict[str, Sequence[float | None]],
                          effective: dict[str, Sequence[float | None]], path, title: str) -> Path:
    """Two panels against router index, one line per series: routing entropy (nats) and effective
    number of sources exp(H). None/NaN points (single-source routers) are skipped."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(13, 5), layout="constrained")
        axes = fig.subplots(1, 2, squeeze=False)[0]
        for ax, series, ylabel, name in ((axes[0], entropy, "entropy (nats, token mean)", "routing entropy"),
                                         (axes[1], effective, "effective sources exp(H) (token mean)",
                                          "effective number of sources")):
            drawn, longest, _ = plots.draw_lines(ax, series)
            if drawn:
                plots.integer_ticks(ax, longest, "final" if longest % 2 else None)
                ax.set_ylim(bottom=0)
            else:
                plots.empty_note(ax, "no multi-source routers")
            ax.set(title=name, xlabel="router = sub-layer index (even: attention, odd: MLP)", ylabel=ylabel)
            plots.legend(ax, drawn)
        fig.suptitle(title)
        return plots.save_figure(fig, path)
