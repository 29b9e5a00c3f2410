"""The one exception type of attnres.data."""

from __future__ import annotations


class DataError(ValueError):
    """A data problem the user can fix (bad config value, missing file, empty split, ...).

    The message names what is wrong and, where there is one, what to do about it.
    """
