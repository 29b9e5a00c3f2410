"""Small corpora written into tmp_path, so most data tests need neither network nor large files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnres.data import DataConfig, ensure_demo_corpus
from attnres.data.python_docs import ensure_python_docs
from tests.data.helpers import make_texts, write_jsonl


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    """A .jsonl corpus of 120 documents with ids doc-0 ... doc-119."""
    return write_jsonl(tmp_path / "corpus" / "docs.jsonl",
                       [{"id": f"doc-{i}", "text": text} for i, text in enumerate(make_texts(120))])


@pytest.fixture
def small_config(corpus_file: Path, tmp_path: Path) -> DataConfig:
    """DataConfig over `corpus_file`, a 300-token BPE, 20% validation, cache under tmp_path."""
    return DataConfig(source=str(corpus_file), vocab_size=300, val_fraction=0.2, cache_dir=str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real demo corpus, built once per session (fetches two Debian packages with apt-get)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("the demo corpus needs apt-get and dpkg-deb (Debian/Ubuntu)")
    return ensure_demo_corpus(tmp_path_factory.mktemp("demo-cache"))


@pytest.fixture(scope="session")
def python_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real python-docs corpus, built once per session (fetches python3.11-doc with apt-get)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("the python-docs corpus needs apt-get and dpkg-deb (Debian/Ubuntu)")
    return ensure_python_docs(tmp_path_factory.mktemp("pydoc-cache"))
