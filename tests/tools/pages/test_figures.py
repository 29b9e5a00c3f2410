"""tools.pages.figures: a measured figure written by hand in a page is found; generated blocks, code
and figures whose line names an existing result file are not."""

from pathlib import Path

import pytest

from tools.pages.figures import handwritten_figures, scan

ROOT = Path(__file__).resolve().parents[3]


def test_the_repository_pages_quote_no_hand_written_figure():
    found = handwritten_figures(ROOT)
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("line, figure", [
    ("Block AttnRes costs 1.14x a standard step.", "1.14x"),
    ("Full AttnRes is -0.109 nats ahead.", "-0.109"),
    ("a difference of 0.02 nats", "0.02 nats"),
    ("an interval of ± 0.041", "±"),
    ("the step takes 426 ms here", "426 ms"),
    ("decoding at 16.6 tokens/s", "16.6 tokens/s"),
    ("peak memory 459.4 MiB", "459.4 MiB"),
    ("set-up took 3 minutes", "3 minutes"),
    ("overhead of 26 % in memory", "26 %"),
    ("the suite runs 1452 tests", "1452 tests"),
])
def test_measurement_like_figures_are_found(line, figure):
    found = scan(f"# Page\n\n{line}\n", "page.md", ROOT)
    assert [f.figure for f in found][:1] == [figure] and found[0].line == 3


@pytest.mark.parametrize("line", [
    "lr 3e-3 with 60 warm-up steps, queries drawn from N(0, 0.02)",  # settings
    "the 95 % interval of the paired difference",  # a confidence level
    "method §3.2 and Python 3.11, torch 2.13.0",  # sections and versions
    "run `attnres bench --set repeats=11` or see [the table](results.md#1.5x)",  # code and link targets
    "24 layers x 256 wide, batch 1 x 256",  # shapes
])
def test_settings_versions_code_and_links_are_not_figures(line):
    assert scan(f"{line}\n", "page.md", ROOT) == []


def test_generated_blocks_and_code_blocks_are_skipped():
    page = ("<!-- attnres:begin bench-costs -->\n| x | 1.14x |\n<!-- attnres:end bench-costs -->\n"
            "```bash\ntime: 3 minutes\n```\n")
    assert scan(page, "page.md", ROOT) == []


def test_a_line_may_quote_a_figure_from_an_existing_result_file_only():
    ok = "Kimi: 1.25x <!-- source: results/published/published.json -->\n"
    missing = "Kimi: 1.25x <!-- source: results/no/such.json -->\n"
    assert scan(ok, "page.md", ROOT) == []
    assert [f.figure for f in scan(missing, "page.md", ROOT)] == ["1.25x"]
