"""Held-out split: by document id, stable, roughly the requested fraction, disjoint."""

from __future__ import annotations

import hashlib

import pytest

from attnres.data import DataConfig, DataError, is_validation, iter_documents, split_of
from tests.data.helpers import make_texts, write_jsonl


def test_fraction_is_roughly_right_and_stable():
    ids = [f"doc-{i}" for i in range(1000)]
    first = [is_validation(i, 0.1, "attnres") for i in ids]
    assert 70 <= sum(first) <= 130
    assert first == [is_validation(i, 0.1, "attnres") for i in ids]
    assert 450 <= sum(is_validation(i, 0.5, "attnres") for i in ids) <= 550


def test_known_values_pin_the_hash_across_machines():
    # The split is blake2b-64 of "salt\0id", top 53 bits / 2**53: specified bit for bit, so it
    # must never change, or caches and held-out sets would silently move.
    digest = hashlib.blake2b(b"attnres\x00doc-0", digest_size=8).digest()
    assert (int.from_bytes(digest, "big") >> 11) / 2**53 == pytest.approx(0.9224663247182608, abs=0)
    assert [is_validation(f"doc-{i}", 0.5, "attnres") for i in range(10)] == [
        False, False, True, False, True, True, False, True, True, False]
    assert not is_validation("doc-0", 0.92, "attnres") and is_validation("doc-0", 0.93, "attnres")


def test_salt_changes_the_split_and_larger_fraction_only_adds():
    ids = [f"doc-{i}" for i in range(1000)]
    a = {i for i in ids if is_validation(i, 0.2, "a")}
    b = {i for i in ids if is_validation(i, 0.2, "b")}
    assert a != b
    assert {i for i in ids if is_validation(i, 0.1, "a")} <= a


def test_no_validation_document_in_training(tmp_path):
    texts = make_texts(200, seed=5)
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    docs = list(iter_documents(DataConfig(source=str(path))))
    val = [d for d in docs if is_validation(d.id, 0.2, "s")]
    train = [d for d in docs if not is_validation(d.id, 0.2, "s")]
    assert val and train and len(val) + len(train) == 200
    assert not {d.id for d in val} & {d.id for d in train}
    assert not {d.text for d in val} & {d.text for d in train}


def test_a_test_split_takes_documents_from_training_and_leaves_validation_alone():
    ids = [f"doc-{i}" for i in range(2000)]
    splits = {i: split_of(i, 0.1, "attnres", test_fraction=0.1) for i in ids}
    assert {i for i, s in splits.items() if s == "val"} == {i for i in ids if is_validation(i, 0.1, "attnres")}
    assert 140 <= sum(s == "test" for s in splits.values()) <= 260
    assert all(split_of(i, 0.1, "attnres") in ("val", "train") for i in ids)  # no test split by default
    wider = {i for i in ids if split_of(i, 0.1, "attnres", test_fraction=0.2) == "test"}
    assert {i for i, s in splits.items() if s == "test"} <= wider  # growing it only moves training documents


@pytest.mark.parametrize("fraction", [-0.1, 0.95, 1.0, float("nan"), "0.1", True])
def test_a_test_fraction_out_of_range_is_refused_by_name(fraction):
    with pytest.raises(DataError, match="test_fraction"):
        DataConfig(val_fraction=0.05, test_fraction=fraction)
