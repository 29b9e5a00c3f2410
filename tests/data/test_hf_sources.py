"""`datasets` sources: local files with FineWeb-Edu's schema, read through "hf:" with streaming
(standing in for the hub), and the resolution of "fineweb-edu"."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnres.data import DataConfig, DataError, iter_documents
from attnres.data.sources import HFSource, hf_source
from tests.data.helpers import make_texts, write_jsonl


def fineweb_records(count: int) -> list[dict]:
    """Rows with the columns of HuggingFaceFW/fineweb-edu."""
    return [{"text": text, "id": f"<urn:uuid:{i:08d}>", "dump": "CC-MAIN-2024-10", "url": f"https://example.org/{i}",
             "file_path": "s3://commoncrawl/x.warc.gz", "language": "en", "language_score": 0.95,
             "token_count": len(text.split()), "score": 3.2, "int_score": 3}
            for i, text in enumerate(make_texts(count, seed=3))]


def test_fineweb_edu_resolves_to_the_hub_dataset():
    assert hf_source(DataConfig(source="fineweb-edu", max_documents=10)) == HFSource(
        "HuggingFaceFW/fineweb-edu", "sample-10BT", "train")
    custom = hf_source(DataConfig(source="fineweb-edu", max_documents=10, hf_config="sample-100BT", hf_split="x"))
    assert (custom.path, custom.name, custom.split) == ("HuggingFaceFW/fineweb-edu", "sample-100BT", "x")
    assert hf_source(DataConfig(source="hf:user/name", hf_config="c")) == HFSource("user/name", "c", "train")
    assert hf_source(DataConfig(source="demo")) is None


def test_local_dataset_dir_streams_documents(tmp_path):
    records = fineweb_records(7)
    write_jsonl(tmp_path / "ds" / "data" / "train-00000.jsonl", records[:4])
    write_jsonl(tmp_path / "ds" / "data" / "train-00001.jsonl", records[4:])
    config = DataConfig(source=f"hf:{tmp_path / 'ds'}")
    assert hf_source(config).path == str(tmp_path / "ds")
    docs = list(iter_documents(config))
    assert sorted((d.id, d.text) for d in docs) == sorted((r["id"], r["text"]) for r in records)
    assert len(list(iter_documents(DataConfig(source=f"hf:{tmp_path / 'ds'}", max_documents=3)))) == 3


def test_parquet_data_file_through_hf(tmp_path):
    records = fineweb_records(5)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "fw.parquet")
    config = DataConfig(source=f"hf:{tmp_path / 'fw.parquet'}")
    resolved = hf_source(config)
    assert (resolved.path, resolved.data_files) == ("parquet", str(tmp_path / "fw.parquet"))
    assert [(d.id, d.text) for d in iter_documents(config)] == [(r["id"], r["text"]) for r in records]


def test_hf_errors(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"content": "x"}])
    with pytest.raises(DataError, match=r"record 0: record has no field 'text'.*\['content'\]"):
        list(iter_documents(DataConfig(source=f"hf:{tmp_path / 'd.jsonl'}")))
    (tmp_path / "d.xml").write_text("<x/>", encoding="utf-8")
    with pytest.raises(DataError, match=r"no `datasets` builder for '\.xml'"):
        list(iter_documents(DataConfig(source=f"hf:{tmp_path / 'd.xml'}")))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="could not load the datasets dataset"):
        list(iter_documents(DataConfig(source=f"hf:{tmp_path / 'empty_dir'}")))


def test_prepare_data_from_a_local_dataset_dir_is_cached(tmp_path):
    from attnres.data import prepare_data

    write_jsonl(tmp_path / "ds" / "train.jsonl", fineweb_records(80))
    config = DataConfig(source=f"hf:{tmp_path / 'ds'}", vocab_size=300, val_fraction=0.2,
                        cache_dir=str(tmp_path / "cache"))
    first = prepare_data(config)
    assert first.stats["train_documents"] + first.stats["val_documents"] == 80
    assert first.stats["source"].startswith("datasets:")
    assert prepare_data(config).stats["reused_cache"] is True
