"""Deprecated spellings: an old public name, keyword or flag keeps working for one minor release.

The policy (CHANGELOG.md): a spelling deprecated in release 0.N still works in 0.N, with a
`DeprecationWarning` (Python) or a one-line note on stderr (command line) naming the new spelling,
and is removed in 0.N+1. Every such warning is written by `deprecation_message`, so all of them
name the release that removes the old spelling.
"""

from __future__ import annotations

import warnings

DEPRECATED_IN = "0.2.0"
REMOVED_IN = "0.3.0"


def deprecation_message(old: str, new: str) -> str:
    """One line: `old` is deprecated, which release removes it, and `new`, the spelling to use."""
    return f"{old} is deprecated since attnres {DEPRECATED_IN} and will be removed in {REMOVED_IN}; use {new}"


def warn_deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """A DeprecationWarning with `deprecation_message(old, new)`, attributed to the caller's caller
    (stacklevel 3: the user's line that called the deprecated function), so Python's default filters
    show it when that line is in the user's own script."""
    warnings.warn(deprecation_message(old, new), DeprecationWarning, stacklevel=stacklevel)
