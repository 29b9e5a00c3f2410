"""Published results at scale: every row says where it was read, nothing cites a document outside the
repository, and a figure that could not be read at its source is marked on the page."""

import decimal
import json
import shutil
from pathlib import Path

from tools.pages.published import PUBLISHED, published_table, variant_lines
from tools.pages.render import Context
from tools.pages.sources import Results

ROOT = Path(__file__).resolve().parents[3]
OUTSIDE = ("/work/", "METHOD.md", "../shared", "file://")


def test_every_row_names_where_it_was_read_and_nothing_outside_the_repository():
    data = json.loads((ROOT / "results" / PUBLISHED).read_text())
    for source in data["sources"]:
        for row in source["rows"]:
            assert row.get("where") and isinstance(row.get("checked"), bool), (source["key"], row["scale"])
        text = json.dumps(source)
        assert not [word for word in OUTSIDE if word in text], source["key"]


def test_a_row_not_read_at_its_source_is_marked_not_checked(tmp_path):
    data = json.loads((ROOT / "results" / PUBLISHED).read_text())
    data["sources"][1]["rows"][0]["checked"] = False
    (tmp_path / "results" / "published").mkdir(parents=True)
    (tmp_path / "results" / PUBLISHED).write_text(json.dumps(data))
    page = published_table(Context(Results(tmp_path), "docs/explanation/results.md"))
    assert page.count("(not checked)") == 1 and "could not be read at its source" in page
    shutil.copy(ROOT / "results" / PUBLISHED, tmp_path / "results" / PUBLISHED)
    page = published_table(Context(Results(tmp_path), "docs/explanation/results.md"))
    assert "(not checked)" not in page and "Every figure was read at the source its row names" in page


def _source(key, rows, **extra):
    return {"key": key, "short": key, "url": f"https://example.org/{key}", "metric": "validation loss",
            "lower_is_better": True, "headline": f"{key} headline", "claims": [], "rows": rows, **extra}


def test_variant_lines_give_each_source_then_each_variant_better_or_worse_with_its_figures():
    D = decimal.Decimal
    rows = [
        {"label": "scaling", "scale": "1B", "checked": True,
         "values": {"standard": D("2.50"), "mhc": D("2.40"), "block_attnres": D("2.60")}},
        {"label": "scaling", "scale": "7B", "values": {"standard": D("2.00"), "mhc": D("1.90")}, "checked": False},
        {"label": "eval train loss", "scale": "7B", "values": {"standard": D("1.8"), "mhc": D("1.7")}, "checked": True},
        {"label": "benchmarks", "scale": "7B", "metric": "MMLU (%)", "lower_is_better": False,
         "values": {"standard": D("59.0"), "mhc": D("63.4")}, "checked": True},
        {"label": "final training loss gap", "scale": "27B", "metric": "training loss, difference", "values": {},
         "delta_vs_standard": {"mhc": D("-0.021")}, "checked": True},
    ]
    lines = variant_lines({"sources": [_source("a", rows), _source("b", [], claims=["it helps"])]})
    assert lines[0] == "- **[a](https://example.org/a)**, validation loss, lower is better: a headline."
    assert lines[1] == ("  - mHC against standard: better in 4 of 4: 1B: 2.40 vs 2.50 (better); "
                        "7B: 1.90 vs 2.00 (not checked) (better); 7B, MMLU (%): 63.4 vs 59.0 (better); "
                        "27B, training loss, difference: -0.021 vs standard (better)")  # the train loss beside 7B: out
    assert lines[2] == "  - Block AttnRes against standard: worse in 1 of 1: 1B: 2.60 vs 2.50 (worse)"
    assert lines[3] == ("- **[b](https://example.org/b)**: no figures recorded (not readable at the source); "
                        "what it claims: it helps.")
    assert len(lines) == 4


def test_variant_lines_of_the_published_file_cover_every_source_and_variant_once():
    data = json.loads((ROOT / "results" / PUBLISHED).read_text(), parse_float=decimal.Decimal)
    lines = variant_lines(data)
    heads = [line for line in lines if line.startswith("- ")]
    assert len(heads) == len(data["sources"])
    for source, head in zip(data["sources"], heads):
        assert f"[{source['short']}]({source['url']})" in head
    variant_count = sum(len({k for r in s["rows"] for k in (*r["values"], *r.get("delta_vs_standard", {}))}
                            - {"standard"}) for s in data["sources"])
    assert sum(1 for line in lines if line.startswith("  - ")) == variant_count
    text = "\n".join(lines)
    # the sources the review asked for, with figures as printed (trailing zeros kept)
    assert "OLMo-7B (6.9B), 500B tokens: 2.559 vs 2.581 (better)" in text
    assert "MATH (EM, 4-shot): 26.0 vs 22.0 (better)" in text and "-0.021 vs standard (better)" in text
    assert "d12, step 1000 (resumed at 500): 1.597053 vs 1.602437 (better)" in text
    assert "hyper-connections (n=1) against standard: worse in 1 of 1" in text


def test_the_table_keeps_losses_and_leaves_accuracies_and_differences_to_the_variant_lines():
    page = published_table(Context(Results(ROOT), "docs/explanation/results.md"))
    assert "hyper-connections" in page.splitlines()[0]
    assert "2.559" in page and "V3 eval loss" in page
    assert "MMLU" not in page.split("\n\n")[0] and "difference to the baseline" not in page.split("\n\n")[0]
