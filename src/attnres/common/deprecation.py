"""Deprecated spellings: an old public name, keyword or flag keeps working for one minor release.

The policy (CHANGELOG.md): a spelling deprecated in release 0.N still works in 0.N, with a
`DeprecationWarning` (Python) or a one-line note on stderr (command line) naming the new spelling,
and is removed in 0.N+1. Every such warning is written by `deprecation_message`, so all of them
name the release that removes the old spelling.
"""

from __future__ import annotations

import warnings

DEPRECATED_IN = "0.3.0"  # the release of the deprecations that name no other (`since`)


def removed_in(since: str) -> str:
    """The release that removes a spelling deprecated in `since`: the next minor ("0.2.0" -> "0.3.0")."""
    major, minor, *_ = since.split(".")
    return f"{major}.{int(minor) + 1}.0"


def deprecation_message(old: str, new: str, since: str = DEPRECATED_IN) -> str:
    """One line: `old` is deprecated, which release removes it, and `new`, the spelling to use."""
    return f"{old} is deprecated since attnres {since} and will be removed in {removed_in(since)}; use {new}"


def warn_deprecated(old: str, new: str, *, since: str = DEPRECATED_IN, stacklevel: int = 3) -> None:
    """A DeprecationWarning with `deprecation_message(old, new, since)`, attributed to the caller's
    caller (stacklevel 3: the user's line that called the deprecated function), so Python's default
    filters show it when that line is in the user's own script."""
    warnings.warn(deprecation_message(old, new, since), DeprecationWarning, stacklevel=stacklevel)
