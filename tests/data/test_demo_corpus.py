"""The demo corpus: parsing the bible reader's output, and the real build from Debian's packages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnres.data import DataConfig, DataError, ensure_demo_corpus, iter_documents
from attnres.data import debian_packages as debian
from attnres.data import demo_corpus as demo

READER_OUTPUT = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void; and darkness was upon the face of
the deep. And the Spirit of God moved upon the face of the waters.

1 Samuel 2

  1 And Hannah prayed, and said,
My heart rejoiceth in the LORD.
  10 The adversaries of the LORD shall be broken to pieces.
"""


def test_parse_drops_verse_numbers_and_unwraps_lines():
    assert demo.parse_bible_output(READER_OUTPUT) == [
        ("Genesis 1", "In the beginning God created the heaven and the earth. And the earth was without form, "
                      "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
                      "the face of the waters."),
        ("1 Samuel 2", "And Hannah prayed, and said, My heart rejoiceth in the LORD. The adversaries of the "
                       "LORD shall be broken to pieces."),
    ]


def test_parse_rejects_output_it_does_not_understand():
    with pytest.raises(DataError, match="verse before any chapter header"):
        demo.parse_bible_output("  1 In the beginning\n")


def hide_debian_tools(monkeypatch, tmp_path, keep=()):
    """PATH holds only stand-ins for the tools in `keep` (apt-get, dpkg-deb), so the rest are missing."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in keep:
        (folder / tool).write_text("#!/bin/sh\nexit 1\n")
        (folder / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


ALTERNATIVES = ("train on other text instead: set data.source to a local .txt, .jsonl or .parquet file or a folder "
                "of them (e.g. --set data.source=./corpus.jsonl, one {\"text\": ...} object a line), or to a Hugging "
                "Face dataset as hf:<name> (e.g. --set data.source=hf:roneneldan/TinyStories "
                "--set data.max_documents=20000)")


def test_without_apt_get_the_demo_corpus_fails_naming_the_other_sources(tmp_path, monkeypatch):
    hide_debian_tools(monkeypatch, tmp_path)
    with pytest.raises(DataError) as failed:
        ensure_demo_corpus(tmp_path / "cache")
    assert str(failed.value) == (
        "the demo corpus (data.source 'demo') is built from Debian's packages bible-kjv, bible-kjv-text with "
        f"apt-get and dpkg-deb (Debian or Ubuntu), and apt-get and dpkg-deb are not on PATH; {ALTERNATIVES}")
    assert not (tmp_path / "cache" / "demo" / demo.DEMO_FILENAME).exists()


def test_the_missing_tool_is_named(tmp_path, monkeypatch):
    hide_debian_tools(monkeypatch, tmp_path, keep=["apt-get"])
    with pytest.raises(DataError, match=r"\(Debian or Ubuntu\), and dpkg-deb is not on PATH; train on other text"):
        ensure_demo_corpus(tmp_path / "cache")


def test_every_failure_of_the_build_names_the_other_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(debian.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(debian.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no such file")))
    with pytest.raises(DataError, match=r"^demo corpus: refreshing the apt package lists \(apt-get update\) failed "
                                        r"\(no such file\); train on other text instead: set data.source"):
        ensure_demo_corpus(tmp_path)


def test_the_sources_the_message_names_are_spelled_as_data_config_reads_them(tmp_path, monkeypatch):
    from attnres.data.sources import hf_source

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"text": "In the beginning"}\n{"text": "was the word"}\n')
    local = DataConfig(source="./corpus.jsonl")
    assert [d.text for d in iter_documents(local)] == ["In the beginning", "was the word"]
    remote = hf_source(DataConfig(source="hf:roneneldan/TinyStories", max_documents=20000))
    assert (remote.path, remote.data_files) == ("roneneldan/TinyStories", None)  # no download: only resolved


def test_the_cli_prints_it_as_one_error_line(tmp_path, monkeypatch, capsys):
    from importlib.resources import files

    from attnres.cli import main

    hide_debian_tools(monkeypatch, tmp_path)
    config = files("attnres") / "configs" / "cpu-tiny.yaml"
    assert main(["train", "--config", str(config), "--set", f"data.cache_dir={tmp_path / 'cache'}",
                 "--set", f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnres train: error: the demo corpus (data.source 'demo') is built from Debian's")
    assert err.count("\n") == 1 and err.endswith(f"{ALTERNATIVES}\n")


def test_demo_corpus_is_the_bible_by_chapter(demo_corpus):
    records = [json.loads(line) for line in demo_corpus.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 1189
    assert records[0]["id"] == "Genesis 1" and records[-1]["id"] == "Revelation 22"
    assert records[0]["text"].startswith("In the beginning God created the heaven and the earth. And the earth")
    assert records[-1]["text"].endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
    assert len({r["id"] for r in records}) == 1189
    assert 3_500_000 < sum(len(r["text"]) for r in records) < 5_000_000
    # Verse numbers are gone and lines unwrapped: no digits glued to line starts, no newlines.
    assert not any("\n" in r["text"] for r in records)
    assert " 2 And the earth" not in records[0]["text"]


def test_second_call_reuses_the_cached_file(demo_corpus, monkeypatch):
    before = demo_corpus.stat().st_mtime_ns

    def no_rebuild():
        raise AssertionError("rebuilt the cached demo corpus")

    monkeypatch.setattr(demo, "_build", no_rebuild)
    assert ensure_demo_corpus(demo_corpus.parent.parent) == demo_corpus
    assert demo_corpus.stat().st_mtime_ns == before


def test_demo_source_reads_the_cached_corpus(demo_corpus):
    config = DataConfig(source="demo", cache_dir=str(demo_corpus.parent.parent), max_documents=3)
    assert [d.id for d in iter_documents(config)] == ["Genesis 1", "Genesis 2", "Genesis 3"]


def test_download_refreshes_package_lists_once_then_retries(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, what, corpus, cwd=None):
        calls.append(command[:2])
        if len(calls) == 1:
            raise DataError("apt-get download failed: unable to locate package")
        return ""

    monkeypatch.setattr(debian.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(debian, "run", fake_run)
    debian.download(demo.PACKAGES, tmp_path, "demo corpus", "demo")
    assert calls == [["apt-get", "download"], ["apt-get", "update"], ["apt-get", "download"]]


def test_prepare_data_on_the_demo_corpus(demo_corpus):
    from attnres.data import is_validation, prepare_data

    config = DataConfig(source="demo", cache_dir=str(demo_corpus.parent.parent), max_documents=150,
                        vocab_size=1000, val_fraction=0.1)
    data = prepare_data(config)
    assert data.stats["train_documents"] + data.stats["val_documents"] == 150
    assert data.stats["source"].startswith("demo: King James Bible")
    first_train = next(f"Genesis {n}" for n in range(1, 51) if not is_validation(f"Genesis {n}", 0.1, "attnres"))
    eos_at = int(np.flatnonzero(np.asarray(data.train_tokens) == data.tokenizer.eos_id)[0])
    text = data.tokenizer.decode(data.train_tokens[:eos_at])
    assert text == next(d.text for d in iter_documents(config) if d.id == first_train)
    # Real English compresses: well under one token per 3 characters at a 1000-token vocabulary.
    assert data.stats["train_tokens"] < len(" ".join(d.text for d in iter_documents(config))) / 3
