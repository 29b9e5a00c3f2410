"""Atomic publication: a file or directory is built under a temporary name, then renamed into place.

Readers see the old version or the whole new one, never a part; a process killed mid-write leaves
a temporary file (`.<name>.*.tmp`) at most, never a truncated target.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def publish(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename the finished file or directory `tmp` to `target` (atomic on one filesystem).

    mkstemp/mkdtemp create owner-only entries; published files are meant to be read like any other.
    """
    os.chmod(tmp, 0o755 if Path(tmp).is_dir() else 0o644)
    os.replace(tmp, target)


@contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "w") -> Iterator:
    """Open a temporary file beside `path` for writing ("w" text, "wb" bytes); on success it replaces
    `path`, on an exception it is removed and `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write text or bytes to `path` atomically; returns the path."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)
    return Path(path)
