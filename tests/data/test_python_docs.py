"""The python-docs corpus: the Python 3.11 documentation's page sources from Debian, one document per page."""

from __future__ import annotations

import json

import pytest

from attnres.data import DataConfig, DataError, iter_documents, prepare_data
from attnres.data import debian_packages as debian
from attnres.data import python_docs
from attnres.data.sources import describe_source


def test_each_page_source_is_one_document_named_by_its_path(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "json.rst.txt").write_text(":mod:`json` --- JSON encoder\n=====\n")
    (tmp_path / "tutorial.rst.txt").write_text("The tutorial\n")
    (tmp_path / "empty.rst.txt").write_text("  \n")
    (tmp_path / "library" / "notes.txt").write_text("not a page source")
    assert python_docs.read_pages(tmp_path) == [("library/json", ":mod:`json` --- JSON encoder\n=====\n"),
                                                ("tutorial", "The tutorial\n")]


def test_a_package_without_the_sources_is_refused_naming_the_other_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(python_docs, "unpack_packages", lambda *args: None)  # unpacks nothing
    with pytest.raises(DataError, match=r"^python-docs corpus: 0 page sources under .*expected about 500; "
                                        r"train on other text instead"):
        python_docs.ensure_python_docs(tmp_path)


def test_without_debian_tools_the_message_names_this_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match=r"^the python-docs corpus \(data.source 'python-docs'\) is built from "
                                        r"Debian's packages python3.11-doc"):
        python_docs.ensure_python_docs(tmp_path)


def test_the_real_corpus_has_every_page_and_splits_by_page(python_docs, tmp_path):
    records = [json.loads(line) for line in python_docs.read_text(encoding="utf-8").splitlines()]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) >= 400 and "library/json" in ids and "tutorial/index" in ids
    assert "import json" in next(r["text"] for r in records if r["id"] == "library/json")
    config = DataConfig(source="python-docs", cache_dir=str(python_docs.parent.parent), vocab_size=300,
                        max_documents=60, val_fraction=0.1, test_fraction=0.1)
    assert describe_source(config).startswith("python-docs: Python 3.11 documentation")
    assert [d.id for d in iter_documents(config)] == ids[:60]
    data = prepare_data(config)
    assert data.stats["train_documents"] + data.stats["val_documents"] + data.stats["test_documents"] == 60
    assert len(data.test_tokens) > 0
