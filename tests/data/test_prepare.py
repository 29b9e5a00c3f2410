"""prepare_data end to end: splits, BPE on training documents only, cache reuse, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnres.data import (DataConfig, DataError, PreparedData, TokenBatches, Tokenizer, is_validation,
                          prepare_data, split_of)
from attnres.data import prepare as prepare_module
from attnres.data.sources import iter_documents
from tests.data.helpers import make_texts, write_jsonl


def packed(texts, tokenizer):
    return np.array([i for t in texts for i in tokenizer.encode(t) + [tokenizer.eos_id]], dtype=np.int64)


def split_texts(config):
    docs = list(iter_documents(config))
    val = [d.text for d in docs if is_validation(d.id, config.val_fraction, config.split_salt)]
    train = [d.text for d in docs if not is_validation(d.id, config.val_fraction, config.split_salt)]
    return train, val


def test_prepare_splits_tokenises_and_saves(small_config, tmp_path, monkeypatch):
    reads = []
    original = prepare_module.iter_documents
    monkeypatch.setattr(prepare_module, "iter_documents", lambda c: reads.append(1) or original(c))
    data = prepare_data(small_config, run_dir=tmp_path / "run")
    assert isinstance(data, PreparedData) and reads == [1]  # documents read once
    train, val = split_texts(small_config)
    stats = data.stats
    assert (stats["train_documents"], stats["val_documents"]) == (len(train), len(val))
    assert len(train) + len(val) == 120 and 10 <= len(val) <= 40
    assert (stats["train_tokens"], stats["val_tokens"]) == (len(data.train_tokens), len(data.val_tokens))
    assert "docs.jsonl" in stats["source"] and stats["vocab_size"] == data.tokenizer.vocab_size == 300
    assert data.train_tokens.dtype == np.uint16 and isinstance(data.train_tokens, np.memmap)
    # The cached memmaps equal a fresh tokenisation, EOS after every document.
    assert np.array_equal(np.asarray(data.train_tokens, dtype=np.int64), packed(train, data.tokenizer))
    assert np.array_equal(np.asarray(data.val_tokens, dtype=np.int64), packed(val, data.tokenizer))
    # Batches come straight from the memmap: every row is a window of the stream.
    batch = TokenBatches(data.train_tokens, seq_len=16, batch_size=4, seed=0).next_batch()
    windows = np.asarray(data.train_tokens[: len(data.train_tokens) // 16 * 16], dtype=np.int64).reshape(-1, 16)
    assert all(any(np.array_equal(row, w) for w in windows) for row in batch.numpy())
    saved = Tokenizer.load(tmp_path / "run" / "tokenizer")
    assert saved.fingerprint == data.tokenizer.fingerprint and saved.encode(val[0]) == data.tokenizer.encode(val[0])


def test_second_run_neither_retrains_nor_retokenises(small_config, monkeypatch):
    first = prepare_data(small_config)
    assert first.stats["reused_cache"] is False
    monkeypatch.setattr(prepare_module, "train_bpe", lambda *a, **k: pytest.fail("re-trained the BPE"))
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda *a, **k: pytest.fail("re-tokenised"))
    monkeypatch.setattr(prepare_module, "iter_documents", lambda *a, **k: pytest.fail("re-read the documents"))
    second = prepare_data(small_config)
    assert second.stats["reused_cache"] is True
    assert second.tokenizer.fingerprint == first.tokenizer.fingerprint
    assert np.array_equal(second.train_tokens, first.train_tokens)
    assert np.array_equal(second.val_tokens, first.val_tokens)
    assert {k: v for k, v in second.stats.items() if k != "reused_cache"} == {
        k: v for k, v in first.stats.items() if k != "reused_cache"}


def test_a_test_split_is_its_own_stream_and_keeps_validation(small_config):
    without = prepare_data(small_config)
    assert without.test_tokens is None and "test_documents" not in without.stats
    config = dataclasses.replace(small_config, test_fraction=0.2)
    data = prepare_data(config)
    docs = list(iter_documents(config))
    test = [d.text for d in docs if split_of(d.id, 0.2, config.split_salt, 0.2) == "test"]
    assert data.stats["test_documents"] == len(test) > 0
    assert data.stats["train_documents"] + data.stats["val_documents"] + len(test) == 120
    assert data.stats["val_documents"] == without.stats["val_documents"]
    assert np.array_equal(data.test_tokens, packed(test, data.tokenizer))  # the BPE, trained without them
    assert data.stats["train_documents"] < without.stats["train_documents"]
    assert np.array_equal(prepare_data(config).test_tokens, data.test_tokens)  # from the cache


def test_an_empty_test_split_is_an_error(small_config):
    with pytest.raises(DataError, match="test split is empty.*test_fraction"):
        prepare_data(dataclasses.replace(small_config, test_fraction=1e-9))


def test_changed_inputs_rebuild(small_config, corpus_file):
    first = prepare_data(small_config)
    other_split = prepare_data(dataclasses.replace(small_config, split_salt="other"))
    assert other_split.stats["reused_cache"] is False
    assert other_split.stats["val_documents"] + other_split.stats["train_documents"] == 120
    capped = prepare_data(dataclasses.replace(small_config, max_documents=60))
    assert capped.stats["train_documents"] + capped.stats["val_documents"] == 60
    write_jsonl(corpus_file, [{"id": f"doc-{i}", "text": t} for i, t in enumerate(make_texts(80, seed=9))])
    edited = prepare_data(small_config)
    assert edited.stats["reused_cache"] is False
    assert edited.stats["train_documents"] + edited.stats["val_documents"] == 80
    assert len(first.train_tokens) != len(edited.train_tokens)


def test_bpe_sees_training_documents_only(tmp_path):
    ids = [f"doc-{i}" for i in range(60)]
    val_id = next(i for i in ids if is_validation(i, 0.2, "attnres"))
    texts = dict(zip(ids, make_texts(60, seed=8)))
    texts[val_id] = " ".join(["zjzjzjzj"] * 300)  # 'z' and 'j' occur nowhere else
    write_jsonl(tmp_path / "d.jsonl", [{"id": i, "text": t} for i, t in texts.items()])
    config = DataConfig(source=str(tmp_path / "d.jsonl"), vocab_size=600, val_fraction=0.2,
                        cache_dir=str(tmp_path / "cache"))
    data = prepare_data(config)
    assert len(data.tokenizer.encode("zjzjzjzj")) == 8  # no merge learnt from the validation text
    # Control: with a salt that puts that document in training, the BPE does learn it.
    salt = next(s for s in (f"salt{k}" for k in range(100)) if not is_validation(val_id, 0.2, s))
    leaky = prepare_data(dataclasses.replace(config, split_salt=salt))
    assert len(leaky.tokenizer.encode("zjzjzjzj")) < 8


def test_pretrained_tokenizer_directory(small_config, tmp_path, monkeypatch):
    trained = prepare_data(small_config).tokenizer
    directory = tmp_path / "pretrained"
    directory.mkdir()
    trained._backend.save(str(directory / "tokenizer.json"))  # a bare tokenizer.json
    monkeypatch.setattr(prepare_module, "train_bpe", lambda *a, **k: pytest.fail("trained instead of loading"))
    config = dataclasses.replace(small_config, tokenizer=str(directory), cache_dir=str(tmp_path / "cache2"))
    data = prepare_data(config)
    assert data.tokenizer.fingerprint == trained.fingerprint and data.stats["tokenizer"] == str(directory)
    train, _ = split_texts(config)
    assert np.array_equal(np.asarray(data.train_tokens, dtype=np.int64), packed(train, trained))


def test_empty_corpus_errors(tmp_path):
    def config_for(records, **kwargs):
        path = write_jsonl(tmp_path / f"c{len(list(tmp_path.iterdir()))}.jsonl", records)
        return DataConfig(source=str(path), vocab_size=300, cache_dir=str(tmp_path / "cache"), **kwargs)

    with pytest.raises(DataError, match="yielded no documents"):
        prepare_data(config_for([{"text": ""}, {"text": "   "}]))
    ids = [f"d{i}" for i in range(100)]
    to_val = next(i for i in ids if is_validation(i, 0.5, "attnres"))
    to_train = next(i for i in ids if not is_validation(i, 0.5, "attnres"))
    with pytest.raises(DataError, match="training split is empty.*lower val_fraction.*max_documents"):
        prepare_data(config_for([{"id": to_val, "text": "only validation"}], val_fraction=0.5))
    with pytest.raises(DataError, match="validation split is empty.*raise val_fraction.*max_documents"):
        prepare_data(config_for([{"id": to_train, "text": "only training"}], val_fraction=0.5))
    assert not (tmp_path / "cache" / "tokenizers").exists() or not any((tmp_path / "cache" / "tokenizers").iterdir())
