"""The reproduction study's tables (tools.pages.study) and its block-count figure (tools/benchmarks/study_figure.py)."""

import copy
import importlib.util
import json
from pathlib import Path

from tools.pages import study
from tools.pages.render import Context
from tools.pages.sources import Results
from tests.report.test_compare_report import make_results

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "benchmarks" / "study_figure.py"
spec = importlib.util.spec_from_file_location("study_figure", SCRIPT)
study_figure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_figure)


def with_block_counts(results: dict) -> dict:
    for n in (1, 4):
        variant = copy.deepcopy(results["variants"][1])
        variant.update(name=f"block_attnres (N={n})", residual="block_attnres", num_blocks=n)
        results["variants"].append(variant)
    return results


def test_the_tables_pair_by_seed_and_name_their_source(tmp_path):
    path = tmp_path / "results" / "study" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(with_block_counts(make_results())))
    ctx = Context(Results(tmp_path), "docs/explanation/study.md")
    text = study.study_variants(ctx)
    full_row = next(line for line in text.splitlines() if line.startswith("| full_attnres |"))
    assert f"| -0.175 ± {12.706 * 0.075:.3f} |" in full_row  # t(0.975, 1) x standard error of (-0.1, -0.25)
    assert "| standard | 2 | 3.100 ± " in text and "results/study/results.json" in text
    blocks = study.study_blocks(ctx)
    assert "| block_attnres (N=1) |" in blocks and "| block_attnres (N=4) |" in blocks


def test_the_block_count_figure_draws_each_variant_in_its_style(tmp_path, captured_figures):
    from matplotlib.colors import to_hex

    from attnres.report.style import variant_style

    (tmp_path / "results.json").write_text(json.dumps(with_block_counts(make_results())))
    study_figure.main(tmp_path)
    points = {(to_hex(line.get_color()), line.get_marker()) for ax in captured_figures["num_blocks.png"].axes
              for line in ax.get_lines() if line.get_marker() not in (None, "None", "")}
    for n in (1, 4):
        style = variant_style("block_attnres", size=n)
        assert (style["color"], style["marker"]) in points, (n, points)
