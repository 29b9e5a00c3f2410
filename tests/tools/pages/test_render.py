"""tools.pages: every generated block of the repository's pages equals what its result files say, and
a change to a result file makes the check fail, naming the page and the block."""

import json
import re
import shutil
from pathlib import Path

import pytest

from tools.pages import PageError, check_pages, render_pages
from tools.pages.markers import find_blocks
from tools.pages.render import same_to_rounding
from tools.pages.__main__ import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The pages and the result files (no figures, HTML or logs) in a temporary copy of the repository."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copytree(ROOT / "results", root / "results", ignore=shutil.ignore_patterns("*.png", "*.html", "*.log", "runs"))
    return root


@pytest.mark.recorded
def test_the_committed_pages_are_what_their_result_files_say():
    assert check_pages(ROOT) == [], "run `python -m tools.pages` and commit the pages"


def test_every_page_block_has_a_generator_and_reads_a_source(copy):
    rendered = render_pages(copy)
    assert copy / "README.md" in rendered  # the README has generated blocks


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_a_changed_result_value_fails_the_check_naming_page_and_block(copy, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(copy, root)
    # one seed of Block AttnRes in the ablation loses 0.5 nats: its paired difference changes
    def worse(data):
        run = next(v for v in data["variants"] if v["name"] == "block_attnres (N=8)")["runs"][0]
        run["final_val_loss"] += 0.5
    _edit(root / "results" / "ablation" / "results.json", worse)
    # and one seed of the protocol's main study's first routed variant: the README's loss column changes
    def worse_test(data):
        next(v for v in data["variants"] if v["residual"] != "standard")["runs"][0]["final_test_loss"] += 0.5
    _edit(root / "results" / "protocol-dense" / "results.json", worse_test)
    stale = check_pages(root)
    assert any(line.startswith("README.md: ") and "recommendation" in line for line in stale), stale
    assert any("ablation-table" in line for line in stale), stale
    assert main(["--root", str(root), "--check"]) == 1
    assert main(["--root", str(root)]) == 0 and check_pages(root) == []  # regenerating makes them current


def test_a_changed_cost_fails_the_check(copy, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(copy, root)
    def slower(data):
        data["models"]["variants"]["block_attnres"]["ratios"]["train_step"] *= 1.5
    _edit(root / "results" / "bench-fp32" / "bench.json", slower)
    assert any(line.startswith("README.md: ") for line in check_pages(root))


def test_a_missing_result_file_is_named(copy, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(copy, root)
    (root / "results" / "scaling" / "results.json").unlink()
    with pytest.raises(PageError, match=r"results/scaling/results.json is missing"):
        render_pages(root)
    assert main(["--root", str(root), "--check"]) == 1


def test_an_unknown_block_is_refused_with_the_known_names(copy, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(copy, root)
    page = root / "docs" / "extra.md"
    page.write_text("<!-- attnres:begin no-such-block -->\n<!-- attnres:end no-such-block -->\n")
    with pytest.raises(PageError, match=r"docs/extra.md: unknown generated block 'no-such-block'; known: .*recommendation"):
        render_pages(root)


def test_the_command_refuses_a_folder_that_is_not_the_repository(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--check"]) == 2
    assert "is not the attnres repository" in capsys.readouterr().err


@pytest.mark.parametrize("old, new", [
    ("Block \u22120.125 \u00b1 0.041 nats", "Block \u22120.124 \u00b1 0.041 nats"),  # one unit of the last digit
    ("| 1.08x | 4.765 |", "| 1.09x | 4.764 |"),
    ("-0.001 or +0.000", "+0.000 or -0.000"),  # across zero
])
def test_a_figure_one_unit_apart_in_its_last_digit_is_current(old, new):
    assert same_to_rounding(old, new)


@pytest.mark.parametrize("old, new", [
    ("Block \u22120.125 nats", "Block \u22120.127 nats"),  # two units
    ("Block \u22120.125 nats", "Block \u22120.12 nats"),  # printed to other digits
    ("8 seeds", "9 seeds"),  # whole numbers are exact
    ("Block 0.125 nats", "Full 0.125 nats"),  # the words are exact
    ("0.125 and 0.3", "0.125"),
])
def test_any_other_difference_is_stale(old, new):
    assert not same_to_rounding(old, new)


def test_a_figure_one_unit_apart_is_not_rewritten(copy, tmp_path):
    from tools.pages import write_pages

    root = tmp_path / "repo"
    shutil.copytree(copy, root)
    readme = root / "README.md"
    text = readme.read_text()
    block = next(b for b in find_blocks(text) if b.name == "recommendation")
    figure = re.search(r"\d+\.(\d+)", text[block.start:block.end])
    digits = len(figure.group(1))
    shifted = f"{float(figure.group(0)) + 10.0 ** -digits:.{digits}f}"
    start = block.start + figure.start()
    readme.write_text(text[:start] + shifted + text[start + len(figure.group(0)):])
    assert check_pages(root) == [] and write_pages(root) == []  # as another CPU might print it: left alone
