"""Published results at scale: every row says where it was read, nothing cites a document outside the
repository, and a figure that could not be read at its source is marked on the page."""

import json
import shutil
from pathlib import Path

from tools.pages.published import PUBLISHED, published_table
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
