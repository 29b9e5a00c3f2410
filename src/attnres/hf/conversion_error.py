"""The one exception type of checkpoint conversion, and the check of a source config's per-layer lists."""

from __future__ import annotations

from attnres.common.errors import InputError


class ConversionError(InputError):
    """A checkpoint that cannot be converted; the message names what is unsupported or wrong."""


def per_layer_list(hf_config: dict, key: str) -> list | None:
    """A source config's per-layer list `key` (layer_types, mlp_layer_types), or None where it is absent
    or null; ConversionError naming the field for anything but a list of strings."""
    values = hf_config.get(key)
    if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
        raise ConversionError(f"{hf_config.get('model_type')}: config.json {key} must be a list of strings, one "
                              f"per layer, got {values!r}")
    return values
