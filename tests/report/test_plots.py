"""Each plot writes a readable PNG, tolerates None/NaN; the heatmap's column order on known inputs."""

import math

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.text import Text

from attnres.report.plots import (DPI, heatmap_matrix, plot_cost_ratios, plot_hidden_rms_by_depth,
                                  plot_loss_curves, plot_max_weight_by_depth, plot_routing_heatmap, router_labels,
                                  source_key)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAN = float("nan")
PHONE_PX = 400  # how wide a phone shows a figure (a 420 px screen less the page's margins)
LEGIBLE_PX = 10  # the smallest text height a reader can read there
MAX_FIGURE_PX = 1000  # wider figures only shrink on a phone and need a zoom on a laptop


def assert_legible(name, fig):
    """Shown PHONE_PX wide, every text of `fig` is at least LEGIBLE_PX tall, and the PNG is at most
    MAX_FIGURE_PX wide (so a desktop shows it near its own size too)."""
    width_in = fig.get_size_inches()[0]
    assert width_in * DPI <= MAX_FIGURE_PX, (name, width_in * DPI)
    for text in fig.findobj(Text):
        if text.get_visible() and text.get_text().strip():
            shown = text.get_fontsize() * PHONE_PX / (72 * width_in)
            assert shown >= LEGIBLE_PX, (name, text.get_text(), round(shown, 1))


def assert_png(path, min_px=300, max_px=2500):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width = imread(path).shape[:2]
    assert min_px <= width <= max_px and min_px <= height <= max_px, (width, height)
    return width, height


def test_heatmap_matrix_orders_columns_and_leaves_unseen_sources_nan():
    names = [["e"], ["e", "p"], ["e", "b1"], ["e", "b1", "p"], ["e", "b10", "b2", "b1"]]
    weights = [[1.0], [0.6, 0.4], [0.3, 0.7], [0.2, 0.3, 0.5], [0.1, 0.2, 0.3, 0.4]]
    columns, matrix = heatmap_matrix(names, weights)
    assert columns == ["e", "b1", "b2", "b10", "p"]  # numeric, not string, order; p last
    nan = np.nan
    expected = [[1.0, nan, nan, nan, nan],
                [0.6, nan, nan, nan, 0.4],
                [0.3, 0.7, nan, nan, nan],
                [0.2, 0.3, nan, nan, 0.5],
                [0.1, 0.4, 0.3, 0.2, nan]]
    np.testing.assert_array_equal(matrix, np.array(expected))


def test_heatmap_matrix_delta_names_and_errors():
    columns, matrix = heatmap_matrix([["e", "d0"], ["e", "d0", "d1"]], [[0.5, 0.5], [0.2, None, 0.8]])
    assert columns == ["e", "d0", "d1"]
    assert math.isnan(matrix[1, 1]) and math.isnan(matrix[0, 2])
    assert heatmap_matrix([], [])[0] == []
    with pytest.raises(ValueError, match="router 0"):
        heatmap_matrix([["e", "D1"]], [[1.0]])
    with pytest.raises(ValueError, match="2 routers"):
        heatmap_matrix([["e"], ["e"]], [[1.0]])


def test_router_labels_mark_kinds_and_the_final_router():
    assert router_labels(4) == ["0 attn", "1 mlp", "2 attn", "3 mlp"]
    assert router_labels(5) == ["0 attn", "1 mlp", "2 attn", "3 mlp", "final"]


def test_loss_curves_with_bands_gaps_and_nan(tmp_path):
    curves = {"standard": [(0, 4.0, 0.1), (10, 3.5, 0.05), (20, 3.2, 0.0)],
              "delta_block (N=4)": [(0, 4.0, 0.0), (10, None, 0.0), (20, NAN, NAN), (30, 3.0, None)],
              "empty": []}
    path = plot_loss_curves(curves, tmp_path / "sub" / "loss.png", "Validation loss")
    assert path == tmp_path / "sub" / "loss.png"
    assert_png(path)
    assert_png(plot_loss_curves({}, tmp_path / "none.png", "nothing"))


def test_routing_heatmap_small_and_large(tmp_path):
    names = [["e"], ["e", "p"], ["e", "b1"], ["e", "b1", "p"], ["e", "b1", "b2"]]
    weights = [[1.0], [0.6, 0.4], [0.3, 0.7], [0.2, 0.3, NAN], [0.1, 0.2, 0.7]]
    assert_png(plot_routing_heatmap(names, weights, tmp_path / "small.png", "Routing weights"))
    # 49 routers (L = 24, with a final router) over 49 sources: labels thinned, figure bounded.
    names = [["e"] + [f"d{k}" for k in range(s)] for s in range(48)] + [["e"] + [f"d{k}" for k in range(48)]]
    weights = [[1 / len(n)] * len(n) for n in names]
    # Taller, not wider: a phone scrolls down, and every row keeps a readable label.
    width, height = assert_png(plot_routing_heatmap(names, weights, tmp_path / "large.png", "Routing weights"),
                               max_px=3000)
    assert width <= MAX_FIGURE_PX and height <= 3000


def test_max_weight_by_depth_skips_none_and_nan(tmp_path):
    series = {"full_attnres": [None, 0.6, 0.5, NAN, 0.4], "delta_attnres": [None, 0.7, 0.55, 0.5],
              "standard": []}
    assert_png(plot_max_weight_by_depth(series, tmp_path / "max.png", "Max routing weight"))
    assert_png(plot_max_weight_by_depth({"standard": []}, tmp_path / "none.png", "Max routing weight"))


def test_hidden_rms_by_depth_linear_and_log(tmp_path):
    assert_png(plot_hidden_rms_by_depth({"a": [1.0, 1.1, 1.2], "b": [1.0, NAN, 1.5]}, tmp_path / "lin.png", "RMS"))
    wide = {"standard": [0.1 * 2 ** i for i in range(9)], "block": [0.1] * 9}  # spans 256x: log scale
    assert_png(plot_hidden_rms_by_depth(wide, tmp_path / "log.png", "RMS"))


def test_cost_ratios_with_missing_values(tmp_path):
    ratios = {"full_attnres": {"step time": {"ratio": 1.8, "low": 1.7, "high": 1.9}, "peak memory": {"ratio": 1.3}},
              "delta_block (N=4)": {"step time": {"ratio": 1.2, "low": 0.9, "high": 2.0, "noisy": True},
                                    "peak memory": {"ratio": None}},
              "block_attnres": {"step time": {"ratio": NAN}, "peak memory": {"ratio": 1.05}}}
    assert_png(plot_cost_ratios(ratios, tmp_path / "cost.png", "Cost relative to standard"))


def test_every_figure_is_legible_at_phone_width(tmp_path, captured_figures):
    names = [["e"], ["e", "p"], ["e", "b1"], ["e", "b1", "p"], ["e", "b1", "b2"]]
    weights = [[1.0], [0.6, 0.4], [0.3, 0.7], [0.2, 0.3, 0.5], [0.1, 0.2, 0.7]]
    plot_routing_heatmap(names, weights, tmp_path / "heat.png", "Routing weights")
    series = {f"variant {k}": [None, 0.5, 0.4, 0.3, 0.2] for k in range(5)}
    plot_max_weight_by_depth(series, tmp_path / "max.png", "Max routing weight")
    plot_loss_curves({"a": [(0, 4.0, 0.1), (10, 3.0, 0.1)], "b": [(0, 4.1, 0.0), (10, 3.2, 0.0)]},
                     tmp_path / "loss.png", "Validation loss")
    plot_cost_ratios({"full_attnres": {"training step": {"ratio": 2.0, "low": 1.9, "high": 2.1, "noisy": False}}},
                     tmp_path / "cost.png", "Cost")
    assert len(captured_figures) == 4
    for name, fig in captured_figures.items():
        assert_legible(name, fig)


def test_heatmap_axis_explains_only_the_sources_it_shows(tmp_path, captured_figures):
    full = [["e"] + [f"d{k}" for k in range(s)] for s in range(4)]
    plot_routing_heatmap(full, [[1 / len(n)] * len(n) for n in full], tmp_path / "full.png", "Full")
    fig = captured_figures["full.png"]
    assert fig.axes[0].get_xlabel() == "source"
    label = fig.get_supxlabel()  # the key, below the figure
    assert "d0…d2 = sub-layer outputs" in label and "e = embedding" in label
    assert "p =" not in label and "partial" not in label  # no partial column here
    block = [["e"], ["e", "p"], ["e", "b1"], ["e", "b1", "p"]]
    plot_routing_heatmap(block, [[1 / len(n)] * len(n) for n in block], tmp_path / "block.png", "Block")
    label = captured_figures["block.png"].get_supxlabel()
    assert "b1 = completed blocks' summed outputs" in label and "p = current block's partial sum" in label
    assert source_key(["e", "D1", "D2"]) == "e = embedding, D1…D2 = completed blocks' summed outputs (deltas)"


def test_router_axis_starts_at_the_first_router_with_data(tmp_path, captured_figures):
    series = {"full_attnres": [None, 0.6, 0.5, 0.4, 0.4], "delta_block (N=2)": [None, None, 0.7, 0.6]}
    plot_max_weight_by_depth(series, tmp_path / "max.png", "Max routing weight")
    ax = captured_figures["max.png"].axes[0]
    ticks = list(ax.get_xticks())
    assert ticks[0] == 1 and ticks[-1] == 4  # no tick for router 0, which has no point
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "final"
    assert ax.get_xlim()[0] == pytest.approx(0.5)


def test_averages_after_layers_get_one_row_per_layer_and_sub_layer_routers_keep_theirs():
    from attnres.report.plots import averages_after_layers, mixer_rows

    dense = [["x1", "x3"], ["e", "x2", "x4", "x6"]]  # DenseFormer 2 x 3 over 6 layers
    assert averages_after_layers(dense) == [3, 6]
    assert mixer_rows(dense) == (["after 3", "after 6"], "average (after layer)")
    routed = [["e"], ["e", "d0"], ["e", "d0", "d1"]]
    assert averages_after_layers(routed) is None
    assert mixer_rows(routed) == (["0 attn", "1 mlp", "final"], "router (sub-layer)")
