"""Tokenizer: BPE training, save/load round trip, EOS, pretrained directories."""

from __future__ import annotations

import json

import pytest

from attnres.data import DataError, Tokenizer, train_bpe
from tests.data.helpers import make_texts

SAMPLE = "Note 7. The river runs past the old mill; naïve café — 東京 🙂\n\tTabs  and  spaces."


@pytest.fixture(scope="module")
def texts():
    return make_texts(150, seed=1)


@pytest.fixture(scope="module")
def bpe(texts):
    return train_bpe(texts, 320)


def test_trained_bpe_basics(bpe):
    assert bpe.vocab_size == 320
    assert bpe.eos_id == bpe._backend.token_to_id("<|endoftext|>") == 0
    ids = bpe.encode(SAMPLE)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == SAMPLE  # byte-level: any text round-trips
    assert bpe.encode_batch([SAMPLE, "river"]) == [ids, bpe.encode("river")]
    # Merges were learnt: a frequent word is fewer tokens than bytes.
    assert len(bpe.encode(" river")) < len(" river".encode())


def test_eos_only_from_packing_not_from_text(bpe):
    ids = bpe.encode("a <|endoftext|> b")
    assert bpe.eos_id not in ids
    assert bpe.decode(ids) == "a <|endoftext|> b"
    assert bpe.decode(bpe.encode("x") + [bpe.eos_id]) == "x<|endoftext|>"


def test_training_is_deterministic_and_fingerprint_tracks_vocab(texts, bpe):
    again = train_bpe(texts, 320)
    assert again.fingerprint == bpe.fingerprint and again.encode(SAMPLE) == bpe.encode(SAMPLE)
    smaller = train_bpe(texts, 290)
    assert smaller.vocab_size == 290 and smaller.fingerprint != bpe.fingerprint
    assert len(bpe.fingerprint) == 16


def test_vocab_size_is_an_upper_bound_and_validated():
    tiny = train_bpe(["ab ab ab"], 4000)
    assert 257 <= tiny.vocab_size < 4000
    with pytest.raises(DataError, match="vocab_size must be an integer >= 260"):
        train_bpe(["x"], 100)


def test_save_load_gives_identical_ids(bpe, tmp_path):
    directory = bpe.save(tmp_path / "tok")
    assert sorted(p.name for p in directory.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    loaded = Tokenizer.load(directory)
    assert loaded.encode(SAMPLE) == bpe.encode(SAMPLE)
    assert (loaded.vocab_size, loaded.eos_id, loaded.fingerprint) == (bpe.vocab_size, bpe.eos_id, bpe.fingerprint)
    assert loaded.encode("a <|endoftext|> b") == bpe.encode("a <|endoftext|> b")


def test_pretrained_tokenizer_json_alone_uses_its_special_eos(bpe, tmp_path):
    (tmp_path / "plain").mkdir()
    bpe._backend.save(str(tmp_path / "plain" / "tokenizer.json"))
    assert Tokenizer.load(tmp_path / "plain").eos_id == bpe.eos_id


def test_pretrained_eos_from_tokenizer_config(bpe, tmp_path):
    directory = bpe.save(tmp_path / "tok")
    vocab = bpe._backend.get_vocab()
    other = next(token for token, index in vocab.items() if index == 300)
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": other}}))
    assert Tokenizer.load(directory).eos_id == 300


def test_pretrained_without_eos_is_an_error(tmp_path):
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    backend = Backend(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    (tmp_path / "noeos").mkdir()
    backend.save(str(tmp_path / "noeos" / "tokenizer.json"))
    with pytest.raises(DataError, match="defines no EOS token"):
        Tokenizer.load(tmp_path / "noeos")
    (tmp_path / "noeos" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(DataError, match=r"EOS token '</s>' is not in the vocabulary"):
        Tokenizer.load(tmp_path / "noeos")


def test_transformers_directory_without_tokenizer_json(bpe, tmp_path):
    # GPT-2's slow-format files (vocab.json + merges.txt): only transformers can assemble them.
    directory = tmp_path / "gpt2"
    directory.mkdir()
    bpe._backend.model.save(str(directory))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "add_prefix_space": False}))
    loaded = Tokenizer.load(directory)
    assert loaded.eos_id == bpe.eos_id
    assert loaded.encode(SAMPLE) == bpe.encode(SAMPLE) and loaded.decode(loaded.encode(SAMPLE)) == SAMPLE


def test_load_errors_name_the_directory(tmp_path):
    with pytest.raises(DataError, match="is not a directory"):
        Tokenizer.load(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty'? has no tokenizer\.json and transformers could not load it"):
        Tokenizer.load(tmp_path / "empty")
