"""The one exception type of checkpoint conversion."""

from __future__ import annotations


class ConversionError(ValueError):
    """A checkpoint that cannot be converted; the message names what is unsupported or wrong."""
