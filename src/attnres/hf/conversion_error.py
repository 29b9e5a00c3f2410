"""The one exception type of checkpoint conversion."""

from __future__ import annotations

from attnres.common.errors import InputError


class ConversionError(InputError):
    """A checkpoint that cannot be converted; the message names what is unsupported or wrong."""
