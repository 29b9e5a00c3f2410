"""Held-out splits by document: a pure function of the document id, never of stream order."""

from __future__ import annotations

from attnres.data.hashing import unit_interval


def is_validation(doc_id: str, fraction: float, salt: str) -> bool:
    """True when document `doc_id` belongs to the validation split.

    blake2b(salt, id) mapped to [0, 1) and compared with `fraction`: the same on every run and
    machine, independent of the order documents arrive in, and growing `fraction` only moves
    documents from train to validation.
    """
    return split_of(doc_id, fraction, salt) == "val"


def split_of(doc_id: str, val_fraction: float, salt: str, test_fraction: float = 0.0) -> str:
    """"val", "test" or "train" for document `doc_id`.

    The document's hash position u in [0, 1) (`is_validation`'s): validation below val_fraction,
    test in [val_fraction, val_fraction + test_fraction), train above. So adding a test split never
    changes the validation documents (it takes its documents from training), and growing
    test_fraction only moves documents from train to test.
    """
    position = unit_interval(f"{salt}\x00{doc_id}")  # the separator keeps ("ab", "c") and ("a", "bc") apart
    if position < val_fraction:
        return "val"
    return "test" if position < val_fraction + test_fraction else "train"
