"""A results folder of synthetic studies beside the committed cost and published files, for the generators."""

import json
import shutil
from pathlib import Path

import pytest

from tools.pages.render import Context
from tools.pages.sources import Results

ROOT = Path(__file__).resolve().parents[3]
SHARED = ("bench-fp32", "bench-fp32-smollm2", "published")


@pytest.fixture
def ctx_with(tmp_path):
    """make(page="README.md", **{folder: results}): a Context whose results/<folder>/results.json hold these
    (another file name where a result has the key "_file")."""
    for name in SHARED:
        shutil.copytree(ROOT / "results" / name, tmp_path / "results" / name)

    def make(page: str = "README.md", **studies) -> Context:
        for folder, content in studies.items():
            (tmp_path / "results" / folder).mkdir(parents=True, exist_ok=True)
            name = content.pop("_file", "results.json")
            (tmp_path / "results" / folder / name).write_text(json.dumps(content))
        return Context(Results(tmp_path), page)
    return make
