"""The one exception type of attnres.data."""

from __future__ import annotations

from attnres.common.errors import InputError


class DataError(InputError):
    """A data problem the user can fix (bad config value, missing file, empty split, ...).

    The message names what is wrong and, where there is one, what to do about it.
    """
