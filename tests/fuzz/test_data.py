"""Fuzzing the local data readers (`attnres.data.iter_documents` over a .txt, .jsonl or .parquet source):
JSON lines with missing, extra and mistyped fields, broken JSON, bad UTF-8 and deep nesting; text files
of any bytes; parquet files with columns of any type, truncated or not parquet at all."""

import io
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from attnres.common.errors import InputError
from attnres.data import DataConfig
from attnres.data.sources import Document, iter_documents
from tests.fuzz.helpers import check_reader, garbage_bytes, json_garbage, json_keys, json_text, json_values, mutated, \
    unchanged

ERRORS = (InputError,)
RECORD = {"text": "In the beginning was the word.", "id": "doc-1", "meta": {"lang": "en"}}

json_lines = st.one_of(mutated(RECORD, json_values, json_keys).map(json_text), json_values.map(json_text),
                       json_garbage, st.text(max_size=20))
fields = st.one_of(st.just("text"), st.just("id"), st.text(min_size=1, max_size=6))


def _documents(path: Path, text_field: str = "text", id_field: str = "id"):
    """Every document of the source `path`, checked to be what iter_documents promises."""
    config = DataConfig(source=str(path), text_field=text_field, id_field=id_field, cache_dir=str(path.parent / "c"))
    documents = list(iter_documents(config))
    assert all(isinstance(d, Document) and isinstance(d.id, str) and isinstance(d.text, str) and d.text.strip()
               for d in documents)
    return documents


def _read(directory: Path, path: Path, *fields_):
    with unchanged(directory):
        return check_reader(lambda: _documents(path, *fields_), ERRORS)


@given(st.lists(json_lines, max_size=6), fields, fields)
def test_jsonl_records(lines, text_field, id_field):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
                                    for line in lines))
        assert isinstance(_read(Path(tmp), path, text_field, id_field), (list, InputError))


@given(garbage_bytes)
def test_text_files(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.txt"
        path.write_bytes(content)
        assert isinstance(_read(Path(tmp), path), (list, InputError))


column_values = st.one_of(st.lists(st.one_of(st.none(), st.text(max_size=10)), max_size=4),
                          st.lists(st.one_of(st.none(), st.integers(-10, 10)), max_size=4),
                          st.lists(st.one_of(st.none(), st.floats()), max_size=4),
                          st.lists(st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2)), max_size=4),
                          st.lists(st.one_of(st.none(), st.binary(max_size=6)), max_size=4))


@st.composite
def parquet_files(draw) -> bytes:
    """A parquet file of random columns (text and id of any type, or missing), maybe cut short or replaced."""
    names = draw(st.lists(fields, min_size=1, max_size=3, unique=True))
    columns = [draw(column_values) for _ in names]
    rows = min(len(c) for c in columns)
    buffer = io.BytesIO()
    pq.write_table(pa.table({name: pa.array(values[:rows]) for name, values in zip(names, columns)}), buffer)
    blob = buffer.getvalue()
    return draw(st.one_of(st.just(blob), st.integers(0, len(blob)).map(lambda end: blob[:end]),
                          st.integers(0, len(blob) - 1).map(lambda at: blob[:at] + b"\xff" + blob[at + 1:]),
                          garbage_bytes))


@given(parquet_files(), fields)
def test_parquet_records(blob, id_field):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.parquet"
        path.write_bytes(blob)
        assert isinstance(_read(Path(tmp), path, "text", id_field), (list, InputError))


def test_jsonl_line_of_a_huge_number():
    """A number of 10^5 digits (Python refuses to convert more than 4300 by default) in a record."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        path.write_text(json.dumps({"text": "x"}) + "\n" + '{"text": "y", "id": ' + "9" * 100_000 + "}\n")
        assert isinstance(_read(Path(tmp), path), InputError)
