"""benchmarks/study_tables.py: paired differences, deep-router statistics and the written tables."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from tests.report.test_compare_report import make_results

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_tables.py"
spec = importlib.util.spec_from_file_location("study_tables", SCRIPT)
study_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_tables)


def test_differences_are_paired_by_seed():
    results = make_results()
    standard, full = results["variants"][0], results["variants"][1]
    assert study_tables.paired_difference(full, standard) == pytest.approx([-0.1, -0.25])
    full["runs"] = full["runs"][1:]  # a seed missing on one side is left out, not mismatched
    assert study_tables.paired_difference(full, standard) == pytest.approx([-0.25])


def test_deep_routing_uses_the_deepest_third_of_multi_source_routers():
    run = make_results()["variants"][1]["runs"][0]  # max weights None, 0.5 .. 1.0 over 7 routers
    deep = study_tables.deep_routing(run)
    # 6 multi-source routers -> the last 2 (6 and 7 sources, uniform weights in the fixture)
    assert deep["max_weight"] == pytest.approx((0.9 + 1.0) / 2)
    assert deep["uniform"] == pytest.approx((1 / 6 + 1 / 7) / 2)
    assert deep["embedding_weight"] == pytest.approx((1 / 6 + 1 / 7) / 2)
    assert math.isnan(deep["effective_sources"])  # the fixture predates effective sources


def test_tables_and_figure_are_written(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(make_results()))
    study_tables.main(tmp_path)
    text = (tmp_path / "tables.md").read_text()
    assert (tmp_path / "figures" / "num_blocks.png").stat().st_size > 0
    full_row = next(line for line in text.splitlines() if line.startswith("| full_attnres |"))
    # mean of -0.1 and -0.25 with t(0.975, 1) = 12.706 times the standard error 0.075
    assert f"-0.175 ± {12.706 * 0.075:.3f}" in full_row
    assert "| standard | 2 | 3.100 ± " in text


def test_block_count_figure_draws_each_variant_in_its_style(tmp_path, captured_figures):
    import copy

    from matplotlib.colors import to_hex

    from attnres.report.style import variant_style

    results = make_results()
    for n in (1, 4):
        variant = copy.deepcopy(results["variants"][1])
        variant.update(name=f"block_attnres (N={n})", residual="block_attnres", num_blocks=n)
        results["variants"].append(variant)
    (tmp_path / "results.json").write_text(json.dumps(results))
    study_tables.main(tmp_path)
    points = {(to_hex(line.get_color()), line.get_marker()) for ax in captured_figures["num_blocks.png"].axes
              for line in ax.get_lines() if line.get_marker() not in (None, "None", "")}
    for n in (1, 4):
        style = variant_style("block_attnres", num_blocks=n)
        assert (style["color"], style["marker"]) in points, (n, points)
