"""PNG figures of training and depth statistics, one function per figure, and the helpers they share.

Figures are `matplotlib.figure.Figure` objects rendered with Agg: no pyplot, no global figure state.
Each function writes one PNG atomically through `save_figure` and returns its path. The public
helpers (`save_figure`, `finite`, `draw_lines`, `legend`, `empty_note`, `thinned`, `integer_ticks`,
`log_scale_if_wide`) are the building blocks of `attnres.report.analyze_plots` too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from attnres.common.atomic import atomic_file

DPI = 120
STYLE = {"font.size": 11, "axes.titlesize": 13, "axes.labelsize": 12, "xtick.labelsize": 10,
         "ytick.labelsize": 10, "legend.fontsize": 10, "axes.grid": True, "grid.alpha": 0.3}
MAX_HEATMAP_LABELS = 30  # beyond this, label every k-th row/column so labels do not overlap
MAX_LINE_LABELS = 20  # the same for the x axis of line plots (8 inches wide)


def finite(value) -> bool:
    """True for a number that is neither None nor NaN/inf: a point that can be drawn."""
    return value is not None and math.isfinite(value)


def save_figure(fig: Figure, path) -> Path:
    """Write `fig` as a PNG to `path` atomically (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)
    return path


def draw_lines(ax, series: dict[str, Sequence[float | None]]) -> tuple[int, int, list[float]]:
    """One line per series against index 0 .. len-1, skipping None/NaN points.

    Returns (lines drawn, length of the longest series, every drawn value).
    """
    drawn, longest, values = 0, 0, []
    for name, ys in series.items():
        points = [(i, v) for i, v in enumerate(ys) if finite(v)]
        longest = max(longest, len(ys))
        values += [v for _, v in points]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=4, label=name)
            drawn += 1
    return drawn, longest, values


def legend(ax, count: int) -> None:
    """A legend where `count` > 1 lines are drawn; a single line is named by the title."""
    if count > 1:
        ax.legend(loc="best", framealpha=0.9)


def empty_note(ax, text: str) -> None:
    """Grey `text` in the middle of empty axes, so a blank panel explains itself."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def thinned(count: int, most: int) -> list[int]:
    """About `most` evenly spaced indices of 0 .. count-1, always with the last (often "final")."""
    step = max(1, math.ceil(count / most))
    ticks = list(range(0, count, step))
    if count and ticks[-1] != count - 1:
        if count - 1 - ticks[-1] < step / 2:
            ticks.pop()  # too close to the last one: its label would overlap
        ticks.append(count - 1)
    return ticks


def integer_ticks(ax, count: int, last_label: str | None = None) -> None:
    """x ticks at integers 0 .. count-1 (thinned when many); the last one optionally renamed."""
    ticks = thinned(count, MAX_LINE_LABELS)
    labels = [str(i) for i in ticks]
    if last_label is not None and labels:
        labels[-1] = last_label
    ax.set_xticks(ticks, labels)


def log_scale_if_wide(ax, values: list[float], ratio: float = 20.0) -> None:
    """Logarithmic y axis when the positive `values` span more than `ratio` times."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) > ratio * min(positive):
        ax.set_yscale("log")


def plot_loss_curves(curves: dict[str, Sequence[tuple[int, float, float]]], path, title: str) -> Path:
    """Validation loss against step, one line per variant; shaded band of ±spread where spread > 0.

    curves: name -> [(step, mean, spread), ...]; points with a None/NaN mean are skipped.
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8, 5), layout="constrained")
        ax = fig.add_subplot()
        drawn = 0
        for name, points in curves.items():
            pts = [(s, m, sp if finite(sp) else 0.0) for s, m, sp in points if finite(m)]
            if not pts:
                continue
            steps, mean, spread = (np.array(c, dtype=float) for c in zip(*pts))
            (line,) = ax.plot(steps, mean, marker="o" if len(pts) < 30 else None, markersize=3, label=name)
            if (spread > 0).any():
                ax.fill_between(steps, mean - spread, mean + spread, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn += 1
        if not drawn:
            empty_note(ax, "no validation points")
        ax.set(title=title, xlabel="training step", ylabel="validation loss (nats/token)")
        if drawn > 1:  # losses fall, so the top right is usually free; "best" is slow on long curves
            ax.legend(loc="upper right", framealpha=0.9)
        return save_figure(fig, path)


def _source_order(name: str) -> tuple:
    """e first, then completed sources by symbol and number (d0 d1 .., b1 b2 .., D1 ..), p last."""
    if name == "e":
        return (0, "", 0)
    if name == "p":
        return (2, "", 0)
    match = re.fullmatch(r"([A-Za-z]+)(\d+)", name)
    return (1, match.group(1), int(match.group(2))) if match else (1, name, 0)


def router_labels(num_routers: int) -> list[str]:
    """Row labels "0 attn", "1 mlp", ...; an odd count means the last router is the final one."""
    has_final = num_routers % 2 == 1  # 2L sub-layer routers, plus one final router in replace mode
    labels = [f"{s} {'attn' if s % 2 == 0 else 'mlp'}" for s in range(num_routers - has_final)]
    return labels + (["final"] if has_final else [])


def heatmap_matrix(source_names: list[list[str]], mean_weights: list[list[float]]) -> tuple[list[str], np.ndarray]:
    """Common source columns and the (n_routers, n_columns) weight matrix, NaN where a router lacks a source.

    Columns: "e", then completed sources in numeric order per symbol, then "p".
    """
    if len(source_names) != len(mean_weights):
        raise ValueError(f"{len(source_names)} routers in source_names but {len(mean_weights)} in mean_weights")
    columns = sorted({n for names in source_names for n in names}, key=_source_order)
    index = {n: j for j, n in enumerate(columns)}
    matrix = np.full((len(source_names), len(columns)), np.nan)
    for r, (names, weights) in enumerate(zip(source_names, mean_weights)):
        if len(names) != len(weights):
            raise ValueError(f"router {r}: {len(names)} source names but {len(weights)} weights")
        for name, w in zip(names, weights):
            matrix[r, index[name]] = np.nan if w is None else w
    return columns, matrix


def plot_routing_heatmap(source_names: list[list[str]], mean_weights: list[list[float]], path, title: str) -> Path:
    """Router (rows) x source (columns) heatmap of mean routing weights; blank where a router lacks a source.

    source_names/mean_weights: per router, as in `DepthStats`. The colour scale is fixed to [0, 1]
    so heatmaps of different variants compare directly.
    """
    columns, matrix = heatmap_matrix(source_names, mean_weights)
    rows, cols = matrix.shape
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(min(15, max(6, 2.5 + 0.3 * cols)), min(13, max(4, 1.8 + 0.28 * rows))),
                     layout="constrained")
        ax = fig.add_subplot()
        ax.grid(False)
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # masked: source not visible
        image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                          interpolation="nearest")
        fig.colorbar(image, ax=ax, label="mean routing weight")
        labels = router_labels(rows)
        row_ticks, col_ticks = thinned(rows, MAX_HEATMAP_LABELS), thinned(cols, MAX_HEATMAP_LABELS)
        ax.set_yticks(row_ticks, [labels[i] for i in row_ticks])
        ax.set_xticks(col_ticks, [columns[j] for j in col_ticks], rotation=90 if cols > 12 else 0)
        if rows * cols and rows <= 24 and cols <= 14:  # small grids: print the numbers too
            for r, c in zip(*np.nonzero(~np.isnan(matrix))):
                value = matrix[r, c]
                ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if value > 0.6 else "white")
        if not rows:
            empty_note(ax, "no routers")
        ax.set(title=title, xlabel="source (e = embedding, p = current partial)", ylabel="router (sub-layer)")
        return save_figure(fig, path)


def plot_max_weight_by_depth(series: dict[str, Sequence[float | None]], path, title: str) -> Path:
    """Largest routing weight (token-mean) against router index, one line per series; None/NaN skipped.

    series: name -> per-router values (as `DepthStats.max_weight`).
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8, 5), layout="constrained")
        ax = fig.add_subplot()
        drawn, longest, _ = draw_lines(ax, series)
        if drawn:
            # An odd router count has a final router last (see `router_labels`).
            integer_ticks(ax, longest, "final" if longest % 2 else None)
        else:
            empty_note(ax, "no multi-source routers")
        ax.set_ylim(0, 1.05)
        ax.set(title=title, xlabel="router = sub-layer index (even: attention, odd: MLP)",
               ylabel="max routing weight (token mean)")
        legend(ax, drawn)
        return save_figure(fig, path)


def plot_hidden_rms_by_depth(series: dict[str, Sequence[float]], path, title: str) -> Path:
    """RMS of each sub-layer's input h_s and of the final hidden state, one line per series.

    series: name -> 2L + 1 values (as `DepthStats.hidden_rms`); the last tick is labelled "final".
    The y axis is logarithmic when the values span more than 20x.
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8, 5), layout="constrained")
        ax = fig.add_subplot()
        drawn, longest, values = draw_lines(ax, series)
        if drawn:
            integer_ticks(ax, longest, "final")
            log_scale_if_wide(ax, values)
        else:
            empty_note(ax, "no values")
        ax.set(title=title, xlabel="sub-layer input h_s (last: final hidden state)", ylabel="RMS")
        legend(ax, drawn)
        return save_figure(fig, path)


def plot_cost_ratios(ratios: dict[str, dict[str, float | None]], path, title: str) -> Path:
    """Grouped bars: per variant, each cost (e.g. "step time", "peak memory") relative to standard.

    ratios: variant -> {metric: ratio}; None/NaN bars are left out. A dashed line marks 1.0.
    """
    metrics = list(dict.fromkeys(m for r in ratios.values() for m in r))
    names = list(ratios)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(min(16, max(7, 2 + 1.3 * len(names) * max(1, len(metrics)) / 2)), 5),
                     layout="constrained")
        ax = fig.add_subplot()
        ax.grid(axis="x", visible=False)
        width = 0.8 / max(1, len(metrics))
        for k, metric in enumerate(metrics):
            values = [ratios[n].get(metric) for n in names]
            xs = [i + (k - (len(metrics) - 1) / 2) * width for i, v in enumerate(values) if finite(v)]
            ys = [v for v in values if finite(v)]
            bars = ax.bar(xs, ys, width=width * 0.95, label=metric)
            ax.bar_label(bars, labels=[f"{v:.2f}×" for v in ys], fontsize=9, padding=2)
            for i, v in enumerate(values):
                if not finite(v):  # say so, rather than leave a gap that reads as zero
                    x = i + (k - (len(metrics) - 1) / 2) * width
                    ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=9, color="0.4",
                            transform=ax.get_xaxis_transform())
        ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1, label="standard = 1")
        ax.set_xticks(range(len(names)), names, rotation=20 if len(names) > 4 else 0,
                      ha="right" if len(names) > 4 else "center")
        ax.set_ylim(0, max([1.0] + [v for r in ratios.values() for v in r.values() if finite(v)]) * 1.15)
        if not names:
            empty_note(ax, "no variants")
        ax.set(title=title, xlabel="variant", ylabel="cost relative to standard (×)")
        # Outside the axes, so it never covers the bar labels.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return save_figure(fig, path)
