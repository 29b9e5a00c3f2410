"""Held-out split by document: a pure function of the document id, never of stream order."""

from __future__ import annotations

from attnres.data.hashing import unit_interval


def is_validation(doc_id: str, fraction: float, salt: str) -> bool:
    """True when document `doc_id` belongs to the validation split.

    blake2b(salt, id) mapped to [0, 1) and compared with `fraction`: the same on every run and
    machine, independent of the order documents arrive in, and growing `fraction` only moves
    documents from train to validation.
    """
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    return unit_interval(f"{salt}\x00{doc_id}") < fraction
