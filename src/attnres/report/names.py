"""File and folder names made from display names (labels, variant names)."""

from __future__ import annotations

import re

# Everything but ASCII letters, digits and "_" is unsafe in a file name on some system or in a URL.
_UNSAFE_CHARACTERS = re.compile(r"[^A-Za-z0-9_]+")


def slug(text: str, keep_case: bool = False, fallback: str = "unnamed") -> str:
    """File-name-safe form of `text`: each run of other characters becomes "-", none at either end.

    Lower-cased unless keep_case: "block_attnres (N=2) step 12" -> "block_attnres-n-2-step-12"
    (figure names), with keep_case "block_attnres (N=4)" -> "block_attnres-N-4" (run folders of
    `attnres compare`, whose existing names must keep matching). `fallback` when nothing is left.
    """
    name = _UNSAFE_CHARACTERS.sub("-", text if keep_case else text.lower()).strip("-")
    return name or fallback


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, with "-x" appended until it is not in `taken`; the result is added to `taken`."""
    while name in taken:
        name += "-x"
    taken.add(name)
    return name
