"""PNG figures of training and depth statistics, one function per figure, and the helpers they share.

Figures are `matplotlib.figure.Figure` objects rendered with Agg: no pyplot, no global figure state.
Each function writes one PNG atomically through `save_figure` and returns its path. The public
helpers (`save_figure`, `finite`, `draw_lines`, `depth_figure`, `legend`, `empty_note`, `thinned`,
`integer_ticks`, `log_scale_if_wide`, `wrapped`, `source_key`, `label_sources`) are the building blocks of
`attnres.report.depth_analysis_plots` too.

Sized for a phone as well as a desktop: every figure is WIDTH inches wide (more panels stack
downwards, never sideways) and no text is smaller than MIN_FONT_PT, so when a page shows a figure
400 px wide, as a phone does, its smallest text is still MIN_FONT_PT * 400 / (72 * WIDTH) = 11 px
tall. The HTML shows figures at most 640 px wide (`attnres.report.document`). Legends sit below the
axes, where they cover no data however many variants a figure draws. Lines take each variant's
one style (`attnres.report.style`), passed in as `styles` (series name -> matplotlib keywords).
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from attnres.common.atomic import atomic_file

DPI = 150  # 900 px per figure: sharp at 400 CSS px on a phone with two device pixels per CSS pixel
WIDTH = 6.0  # inches, every figure
MIN_FONT_PT = 12  # the smallest text anywhere in a figure: tick labels, legends, cell values
STYLE = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": MIN_FONT_PT,
         "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "figure.titlesize": 15,
         "axes.grid": True, "grid.alpha": 0.3}
MAX_HEATMAP_LABELS = 16  # beyond this, label every k-th column so rotated 12 pt labels do not overlap
MAX_HEATMAP_ROWS = 50  # rows are labelled one by one up to this many (the figure grows in height)
MAX_LINE_LABELS = 12  # the same for the x axis of line plots
ANNOTATE_COLUMNS = 9  # heatmaps print their cell values up to this many columns ("0.25" fits a cell)
ROW_HEIGHT = 0.32  # inches per heatmap row: a 12 pt label or value fits
TITLE_CHARACTERS = 48  # a title wraps beyond this many characters (14 pt across 6 in)
LABEL_CHARACTERS = 56  # an axis label wraps beyond this many (13 pt)
MARKER_SIZE = 5


def finite(value) -> bool:
    """True for a number that is neither None nor NaN/inf: a point that can be drawn."""
    return value is not None and math.isfinite(value)


def wrapped(text: str, width: int = TITLE_CHARACTERS) -> str:
    """`text` broken into lines of at most `width` characters (a figure never grows sideways)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)) or text


def save_figure(fig: Figure, path) -> Path:
    """Write `fig` as a PNG to `path` atomically (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)
    return path


def new_figure(height: float, rows: int = 1, **subplots) -> tuple[Figure, list]:
    """A WIDTH-wide figure of `height` inches with `rows` axes stacked vertically (constrained layout)."""
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False, **subplots)[:, 0]
    return fig, list(axes)


def draw_lines(ax, series: dict[str, Sequence[float | None]], styles: dict[str, dict] | None = None,
               empty: str = "no values", final: bool | None = False) -> tuple[int, list[float]]:
    """One line per series against index 0 .. len-1, skipping None/NaN points; each in its style
    (`styles[name]`, matplotlib keywords as `attnres.report.style.variant_style` gives; default: the cycle).
    x ticks from the first index with a point (`integer_ticks`), the last one "final" if `final`, or
    where the count is odd if `final` is None (routers that end with the final router); `empty` in
    grey when nothing is drawn. Returns how many lines were drawn and every drawn value."""
    drawn, longest, values, first = 0, 0, [], None
    for name, ys in series.items():
        points = [(i, v) for i, v in enumerate(ys) if finite(v)]
        longest = max(longest, len(ys))
        values += [v for _, v in points]
        if points:
            first = points[0][0] if first is None else min(first, points[0][0])
            ax.plot(*zip(*points), markersize=MARKER_SIZE, label=name, **_line_style(styles, name))
            drawn += 1
    if drawn:
        last = longest % 2 == 1 if final is None else final
        integer_ticks(ax, longest, "final" if last else None, first=first)
    else:
        empty_note(ax, empty)
    return drawn, values


def depth_figure(series: dict[str, Sequence[float | None]], path, title: str, styles: dict[str, dict] | None,
                 xlabel: str, ylabel: str, empty: str, final: bool | None, log: bool = False,
                 ylim: tuple[float, float] | None = None) -> Path:
    """One axes of per-depth `series` (`draw_lines`, with `empty` and `final`), the y axis logarithmic
    where `log` and the values span more than 20x, or fixed to `ylim`; the legend below."""
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure(4.8 + 0.25 * math.ceil(len(series) / 2))
        drawn, values = draw_lines(ax, series, styles, empty, final)
        if log:
            log_scale_if_wide(ax, values)
        if ylim:
            ax.set_ylim(*ylim)
        ax.set(title=wrapped(title), xlabel=xlabel, ylabel=ylabel)
        legend(ax, drawn)
        return save_figure(fig, path)


def _line_style(styles: dict[str, dict] | None, name: str) -> dict:
    return dict((styles or {}).get(name) or {"marker": "o"})


def legend(ax, count: int) -> None:
    """A legend below the figure's axes where `count` > 1 lines are drawn (a single line is named by
    the title); one per figure, from `ax`'s lines, in two columns when there are many."""
    if count > 1:
        handles, labels = ax.get_legend_handles_labels()
        ax.figure.legend(handles, labels, loc="outside lower center", ncols=2 if count > 3 else count,
                         frameon=False)


def figure_legend(fig: Figure):
    """The legend a figure shows (one below its axes, or one inside its first axes); None if none."""
    if fig.legends:
        return fig.legends[0]
    return next((ax.get_legend() for ax in fig.axes if ax.get_legend() is not None), None)


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


def integer_ticks(ax, count: int, last_label: str | None = None, first: int = 0) -> None:
    """x ticks at integers first .. count-1 (thinned when many), the last one optionally renamed; the
    x range ends half a step beyond them, so no tick stands where no series has a point."""
    ticks = [first + i for i in thinned(max(0, count - first), MAX_LINE_LABELS)]
    labels = [str(i) for i in ticks]
    if last_label is not None and labels:
        labels[-1] = last_label
    ax.set_xticks(ticks, labels)
    if ticks:
        ax.set_xlim(first - 0.5, count - 0.5)


def log_scale_if_wide(ax, values: list[float], ratio: float = 20.0) -> None:
    """Logarithmic y axis when the positive `values` span more than `ratio` times."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) > ratio * min(positive):
        ax.set_yscale("log")


def plot_loss_curves(curves: dict[str, Sequence[tuple[int, float, float]]], path, title: str,
                     styles: dict[str, dict] | None = None) -> Path:
    """Validation loss against step, one line per variant; shaded band of ±spread where spread > 0.

    curves: name -> [(step, mean, spread), ...]; points with a None/NaN mean are skipped.
    styles: name -> matplotlib keywords (`attnres.report.style`).
    """
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure(4.8 + 0.25 * math.ceil(len(curves) / 2))
        drawn = 0
        for name, points in curves.items():
            pts = [(s, m, sp if finite(sp) else 0.0) for s, m, sp in points if finite(m)]
            if not pts:
                continue
            steps, mean, spread = (np.array(c, dtype=float) for c in zip(*pts))
            style = _line_style(styles, name)
            if len(pts) >= 30:
                style["marker"] = None  # long curves: markers would merge into a thick line
            (line,) = ax.plot(steps, mean, markersize=MARKER_SIZE - 1, label=name, **style)
            if (spread > 0).any():
                ax.fill_between(steps, mean - spread, mean + spread, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn += 1
        if not drawn:
            empty_note(ax, "no validation points")
        ax.set(title=wrapped(title), xlabel="training step", ylabel="validation loss (nats/token)")
        legend(ax, drawn)
        return save_figure(fig, path)


def _source_order(name: str) -> tuple:
    """e first, then completed sources by symbol and number (d0 d1 .., b1 b2 .., D1 ..), p last."""
    if name == "e":
        return (0, "", 0)
    if name == "p":
        return (2, "", 0)
    match = re.fullmatch(r"([A-Za-z]+)(\d+)", name)
    return (1, match.group(1), int(match.group(2))) if match else (1, name, 0)


# What each source symbol of `SourcePolicy.source_names` means (method §3).
SOURCE_MEANINGS = {"d": "sub-layer outputs", "b": "completed blocks' summed outputs",
                   "D": "completed blocks' summed outputs (deltas)", "x": "layer outputs (states)"}


def source_key(columns: Sequence[str]) -> str:
    """What the source names in `columns` stand for, only those present, e.g. "e = embedding,
    b1…b3 = completed blocks' summed outputs, p = current block's partial sum"."""
    return ", ".join(_source_meanings(columns))


def _source_meanings(columns: Sequence[str]) -> list[str]:
    parts = ["e = embedding"] if "e" in columns else []
    groups: dict[str, list[int]] = {}
    for name in columns:
        match = re.fullmatch(r"([A-Za-z])(\d+)", name)
        if match:
            groups.setdefault(match.group(1), []).append(int(match.group(2)))
    for symbol, numbers in groups.items():
        low, high = min(numbers), max(numbers)
        names = f"{symbol}{low}" if low == high else f"{symbol}{low}…{symbol}{high}"
        parts.append(f"{names} = {SOURCE_MEANINGS.get(symbol, 'sources')}")
    if "p" in columns:
        parts.append("p = current block's partial sum")
    return parts


def label_sources(fig: Figure, axes: Sequence, columns: Sequence[str]) -> None:
    """Label the source axis of router x source panels: "source" under each, and below the figure
    (where it spans the whole width and covers no colour bar) the `source_key` of the columns shown,
    its items ("b1…b3 = ...") kept whole on lines of at most LABEL_CHARACTERS."""
    for ax in axes:
        ax.set_xlabel("source")
    lines: list[str] = []
    for part in _source_meanings(columns):
        if lines and len(lines[-1]) + len(part) + 2 <= LABEL_CHARACTERS:
            lines[-1] += f", {part}"
        else:
            lines.append(part)
    if lines:
        fig.supxlabel("\n".join(lines), fontsize=MIN_FONT_PT)


ROUTER_AXIS = "router (sub-layer)"  # `ResidualScheme.mixer_axis` of mixers that belong to sub-layers


def mixer_layout(stats: dict) -> tuple[list[str], str]:
    """Row labels and axis label of a `DepthStats` dict's mixers: the scheme's, as recorded
    (`mixer_labels`, `mixer_axis`), or, for a file written before they were, read from the source
    names (`mixer_rows`)."""
    if stats.get("mixer_labels"):
        return list(stats["mixer_labels"]), stats["mixer_axis"]
    return mixer_rows(stats["source_names"])


def averages_after_layers(source_names: list[list[str]]) -> list[int] | None:
    """For files that do not record their mixers' labels: DenseFormer-style mixers (each one's last
    source the state x{t} of the layer it follows) and the layers t they average after; None for
    routers of sub-layers."""
    last = [re.fullmatch(r"x(\d+)", names[-1]) if names else None for names in source_names]
    return [int(m.group(1)) for m in last] if last and all(last) else None


def mixer_rows(source_names: list[list[str]]) -> tuple[list[str], str]:
    """Heatmap row labels and the axis label: "0 attn", "1 mlp", ..., "final" for sub-layer routers;
    "after 1", "after 2", ... for averages after layers."""
    layers = averages_after_layers(source_names)
    if layers is not None:
        return [f"after {t}" for t in layers], "average (after layer)"
    return router_labels(len(source_names)), ROUTER_AXIS


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


def annotate_cells(ax, matrix: np.ndarray, dark_above: float | None = 0.6, light_band: float | None = None) -> None:
    """Print each finite cell's value (two decimals, MIN_FONT_PT); black on bright cells, white on dark.

    dark_above: for a sequential map, values above it get black text; with dark_above None (a
    diverging map, pale near zero) values within ±light_band get black text.
    """
    for r, c in zip(*np.nonzero(~np.isnan(matrix))):
        value = matrix[r, c]
        bright = value > dark_above if dark_above is not None else abs(value) < light_band
        ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=MIN_FONT_PT,
                color="black" if bright else "white")


def draw_heatmap(ax, matrix: np.ndarray, row_labels: list[str], columns: list[str]):
    """One router x source panel of mean routing weights on [0, 1] (viridis; blank where a router cannot
    see a source), its ticks, and cell values where they fit; returns the image (for a colour bar)."""
    ax.grid(False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # masked: source not visible
    rows, cols = matrix.shape
    shown = matrix if rows and cols else np.full((1, max(cols, 1)), np.nan)
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")
    row_ticks, col_ticks = thinned(rows, MAX_HEATMAP_ROWS), thinned(cols, MAX_HEATMAP_LABELS)
    ax.set_yticks(row_ticks, [row_labels[i] for i in row_ticks])
    ax.set_xticks(col_ticks, [columns[j] for j in col_ticks], rotation=90 if cols > 8 else 0)
    if rows and cols <= ANNOTATE_COLUMNS:
        annotate_cells(ax, matrix, dark_above=0.6)
    return image


def plot_routing_heatmap(source_names: list[list[str]], mean_weights: list[list[float]], path, title: str,
                         layout: tuple[list[str], str] | None = None) -> Path:
    """Router (rows) x source (columns) heatmap of mean routing weights; blank where a router lacks a source.

    source_names/mean_weights: per router, as in `DepthStats`; layout: the rows' labels and axis label
    (`mixer_layout`; None: read from the source names). The colour scale is fixed to [0, 1] so
    heatmaps of different variants compare directly. The x label explains the source names shown.
    """
    columns, matrix = heatmap_matrix(source_names, mean_weights)
    rows = matrix.shape[0]
    labels, ylabel = layout or mixer_rows(source_names)
    with matplotlib.rc_context(STYLE):
        # rows, plus title, tick labels and the two-line x label
        fig, (ax,) = new_figure(min(2.6 + ROW_HEIGHT * max(rows, 3), 2.6 + ROW_HEIGHT * MAX_HEATMAP_ROWS))
        image = draw_heatmap(ax, matrix, labels, columns)
        fig.colorbar(image, ax=ax, label="mean routing weight", shrink=1.0 if rows <= 20 else 0.6)
        if not rows:
            empty_note(ax, "no routers")
        ax.set(title=wrapped(title), ylabel=ylabel)
        label_sources(fig, [ax], columns)
        return save_figure(fig, path)


def plot_max_weight_by_depth(series: dict[str, Sequence[float | None]], path, title: str,
                             styles: dict[str, dict] | None = None) -> Path:
    """Largest routing weight (token-mean) against router index, one line per series; None/NaN skipped.

    series: name -> per-router values (as `DepthStats.max_weight`). The x axis starts at the first
    router with a value (single-source routers have none); an odd router count has a final router last.
    """
    return depth_figure(series, path, title, styles, "router = sub-layer index (even: attention, odd: MLP)",
                        "max routing weight (token mean)", "no multi-source routers", final=None,
                        ylim=(0, 1.05))


def plot_hidden_rms_by_depth(series: dict[str, Sequence[float]], path, title: str,
                             styles: dict[str, dict] | None = None) -> Path:
    """RMS of each sub-layer's input h_s and of the final hidden state, one line per series.

    series: name -> 2L + 1 values (as `DepthStats.hidden_rms`); the last tick is labelled "final".
    The y axis is logarithmic when the values span more than 20x.
    """
    return depth_figure(series, path, title, styles, "sub-layer input h_s (last: final hidden state)", "RMS",
                        "no values", final=True, log=True)


def plot_cost_ratios(costs: dict[str, dict[str, dict]], path, title: str,
                     styles: dict[str, dict] | None = None) -> Path:
    """One panel per cost metric, stacked: a horizontal bar per variant, its cost relative to standard.

    costs: variant -> {metric (e.g. "training step"): {"ratio", and optionally "low", "high" (the
    spread, drawn as a whisker) and "noisy"}}. A noisy bar is hatched and pale and labelled "noisy"
    with its range instead of a number; a missing (None/NaN) ratio is labelled "n/a". A dashed line
    marks 1.0 (standard). Bars take each variant's colour (`styles`).
    """
    metrics = list(dict.fromkeys(m for per in costs.values() for m in per))
    names = list(costs)

    def row_height(metric) -> float:  # a noisy bar's label takes two lines
        noisy = any((costs[n].get(metric) or {}).get("noisy") for n in names)
        return 0.62 if noisy else 0.42

    heights = [0.9 + row_height(m) * max(1, len(names)) for m in metrics or [None]]
    with matplotlib.rc_context(STYLE):
        fig, axes = new_figure(0.6 + sum(heights), rows=len(heights), height_ratios=heights)
        for ax, metric in zip(axes, metrics or [None]):
            ax.grid(axis="y", visible=False)
            ys = list(range(len(names)))
            top = 1.0
            for y, name in zip(ys, names):
                entry = costs[name].get(metric) or {}
                value, low, high = entry.get("ratio"), entry.get("low"), entry.get("high")
                color = _line_style(styles, name).get("color", "C0")
                if not finite(value):
                    ax.text(0.02, y, "n/a", va="center", color="0.4", transform=ax.get_yaxis_transform())
                    continue
                noisy = bool(entry.get("noisy"))
                whisker = None
                if finite(low) and finite(high):
                    whisker = [[value - low], [high - value]]
                    top = max(top, high)
                top = max(top, value)
                ax.barh(y, value, height=0.7, color=color, alpha=0.35 if noisy else 0.9,
                        hatch="//" if noisy else None, edgecolor=color, xerr=whisker, capsize=3,
                        error_kw={"elinewidth": 1, "ecolor": "0.2"})
                label = f"noisy:\n{low:.2f}–{high:.2f}×" if noisy and whisker else f"{value:.2f}×"
                ax.annotate(label, (max(value, high if finite(high) else value), y), xytext=(5, 0),
                            textcoords="offset points", va="center", fontsize=MIN_FONT_PT)
            ax.axvline(1.0, color="0.2", linestyle="--", linewidth=1)
            ax.set_yticks(ys, names)
            ax.set_ylim(len(names) - 0.5, -0.5)  # first variant on top, as in the tables
            ax.set_xlim(0, top * 1.5)  # room for the labels right of the bars
            if not names:
                empty_note(ax, "no variants")
            ax.set(title=metric or "no costs", xlabel="× standard (dashed line: standard = 1)", ylabel="variant")
        fig.suptitle(wrapped(title))
        return save_figure(fig, path)


def plot_rate_search(searches: dict[str, Sequence[tuple[float, float]]], chosen: dict[str, float], path, title: str,
                     styles: dict[str, dict] | None = None) -> Path:
    """Mean validation loss against peak learning rate (log axis), one line per variant, its chosen
    rate circled. searches: name -> [(rate, mean loss), ...]; a non-finite mean (a diverged rate) is
    not drawn."""
    with matplotlib.rc_context(STYLE):
        fig, (ax,) = new_figure(4.8 + 0.25 * math.ceil(len(searches) / 2))
        drawn = 0
        for name, points in searches.items():
            pts = sorted((r, m) for r, m in points if finite(m))
            if not pts:
                continue
            (line,) = ax.plot(*zip(*pts), markersize=MARKER_SIZE, label=name, **_line_style(styles, name))
            best = dict(pts).get(chosen.get(name))
            if best is not None:
                ax.plot([chosen[name]], [best], marker="o", markersize=3 * MARKER_SIZE, fillstyle="none",
                        linestyle="none", color=line.get_color())
            drawn += 1
        if not drawn:
            empty_note(ax, "no finished rate")
        ax.set_xscale("log")
        rates = sorted({r for points in searches.values() for r, _ in points})
        ax.minorticks_off()  # log-axis minor labels (2x10^-3, 3x10^-3, ...) would overlap
        ax.set_xticks(rates, [f"{r:g}" for r in rates], rotation=30)
        ax.set(title=wrapped(title), xlabel="peak learning rate", ylabel="validation loss (nats/token)")
        legend(ax, drawn)
        return save_figure(fig, path)
