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


def umask_mode(directory: bool = False) -> int:
    """The mode a new file (0o666) or directory (0o777) gets from open()/mkdir() under this process's umask."""
    mask = _umask()
    return (0o777 if directory else 0o666) & ~mask


def _umask() -> int:
    try:  # Linux reports it without changing it; os.umask can only be read by setting it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike[str]) -> None:
    """Give `path` (and, for a directory, everything inside it) the mode the umask gives new entries.

    mkstemp/mkdtemp and some writers (safetensors' save_file) create owner-only entries; published
    files are meant to be read like every other file the process writes."""
    path = Path(path)
    file_mode, dir_mode = umask_mode(), umask_mode(directory=True)  # the umask read once, not per entry
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        if not entry.is_symlink():
            os.chmod(entry, dir_mode if entry.is_dir() else file_mode)


def publish(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename the finished file or directory `tmp` to `target` (atomic on one filesystem), after giving
    it (and what it holds) the umask's mode (`apply_umask`)."""
    apply_umask(tmp)
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
