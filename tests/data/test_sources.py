"""Local sources: .txt folders, .jsonl and .parquet files, and the errors for bad input."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnres.data import DataConfig, DataError, Document, iter_documents
from tests.data.helpers import write_jsonl


def documents(source, **kwargs):
    return list(iter_documents(DataConfig(source=str(source), **kwargs)))


def test_txt_folder_one_document_per_file_recursive_sorted(tmp_path):
    root = tmp_path / "texts"
    (root / "b").mkdir(parents=True)
    (root / "b" / "two.txt").write_text("Second file.\nWith two lines.\n", encoding="utf-8")
    (root / "a.txt").write_text("First file.", encoding="utf-8")
    (root / "empty.txt").write_text("  \n", encoding="utf-8")
    (root / "notes.md").write_text("not a document", encoding="utf-8")
    (root / ".hidden.txt").write_text("hidden", encoding="utf-8")
    assert documents(root) == [Document("a.txt", "First file."),
                               Document("b/two.txt", "Second file.\nWith two lines.\n")]
    assert documents(root / "a.txt") == [Document("a.txt", "First file.")]


def test_jsonl_ids_text_and_hashed_ids(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"id": 7, "text": "seven", "extra": 1},
        {"text": "no id here"},
        {"id": "x", "text": ""},
        {"id": None, "text": "no id here"},
    ])
    docs = documents(path)
    assert [d.text for d in docs] == ["seven", "no id here", "no id here"]
    assert docs[0].id == "7"
    # Without an id the text decides it: stable and equal for equal texts.
    assert docs[1].id == docs[2].id and docs[1].id.startswith("blake2b:")
    assert documents(path)[1].id == docs[1].id


def test_custom_fields_and_max_documents(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"key": f"k{i}", "body": f"text {i}"} for i in range(10)])
    docs = documents(path, text_field="body", id_field="key", max_documents=3)
    assert docs == [Document("k0", "text 0"), Document("k1", "text 1"), Document("k2", "text 2")]


def test_parquet_reads_text_and_id_columns(tmp_path):
    table = pa.table({"id": ["p0", "p1", "p2"], "text": ["alpha", None, "gamma"], "other": [1, 2, 3]})
    pq.write_table(table, tmp_path / "d.parquet")
    assert documents(tmp_path / "d.parquet") == [Document("p0", "alpha"), Document("p2", "gamma")]


def test_folder_mixing_formats_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "mix" / "b.jsonl", [{"id": "j", "text": "from jsonl"}])
    pq.write_table(pa.table({"text": ["from parquet"]}), tmp_path / "mix" / "c.parquet")
    (tmp_path / "mix" / "a.txt").write_text("from txt", encoding="utf-8")
    assert [d.text for d in documents(tmp_path / "mix")] == ["from txt", "from jsonl", "from parquet"]


def test_missing_path_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match="no such file or directory") as info:
        documents(missing)
    assert str(missing) in str(info.value)


def test_unsupported_extension_names_allowed_ones(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"unsupported file extension '\.csv'.*\.txt, \.jsonl, \.parquet"):
        documents(path)


def test_folder_without_documents(tmp_path):
    (tmp_path / "only.md").write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="no .txt, .jsonl, .parquet files under"):
        documents(tmp_path)


def test_missing_text_field_jsonl_and_parquet(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "ok"}, {"content": "wrong field"}])
    with pytest.raises(DataError, match=r"d\.jsonl:2: record has no field 'text'.*\['content'\]"):
        documents(path)
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"no column 'text'.*\['content'\]"):
        documents(tmp_path / "d.parquet")


def test_bad_json_and_non_string_text(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{not json\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON"):
        documents(bad)
    write_jsonl(tmp_path / "num.jsonl", [{"text": 5}])
    with pytest.raises(DataError, match="must be a string, got int"):
        documents(tmp_path / "num.jsonl")
