"""Each plot writes a readable PNG, tolerates None/NaN; the heatmap's column order on known inputs."""

import math

import numpy as np
import pytest
from matplotlib.image import imread

from attnres.report.plots import (heatmap_matrix, plot_cost_ratios, plot_hidden_rms_by_depth, plot_loss_curves,
                                  plot_max_weight_by_depth, plot_routing_heatmap, router_labels)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAN = float("nan")


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
    width, height = assert_png(plot_routing_heatmap(names, weights, tmp_path / "large.png", "Routing weights"))
    assert width <= 1800 and height <= 1560


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
    ratios = {"full_attnres": {"step time": 1.8, "peak memory": 1.3},
              "delta_block (N=4)": {"step time": 1.2, "peak memory": None},
              "block_attnres": {"step time": NAN, "peak memory": 1.05}}
    assert_png(plot_cost_ratios(ratios, tmp_path / "cost.png", "Cost relative to standard"))
