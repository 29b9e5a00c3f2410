"""Stable hashes: the same input gives the same value on every run, machine and Python version."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(data: str | bytes, size: int = 16) -> str:
    """Hex blake2b digest of `data` (str is UTF-8 encoded), `2 * size` hex characters."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def unit_interval(data: str) -> float:
    """Map `data` to a float in [0, 1), uniformly for distinct inputs."""
    # 53 bits: exactly representable in a float, so the mapping does not depend on rounding mode.
    value = int.from_bytes(hashlib.blake2b(data.encode("utf-8"), digest_size=8).digest(), "big") >> 11
    return value / float(1 << 53)


def cache_key(parts: dict[str, Any]) -> str:
    """Short key for a JSON-serialisable description of what a cached artifact depends on."""
    return digest(json.dumps(parts, sort_keys=True, separators=(",", ":")), size=10)
