"""Atomic publication: a file or directory is built under a temporary name, then renamed into place.

Readers see the old version or the whole new one, never a part; a process killed mid-write leaves
a temporary file (`.<name>.*.tmp`) at most, never a truncated target.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

# The errors of a machine's storage, not of attnres: a full disk or quota, a file system turned
# read-only or failing, a file grown past its limit, permissions changed under a running process.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES,
                            errno.EPERM})


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
def naming_failures(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise an OSError from inside that names no file (a write() on an open file, os.pwrite), and
    safetensors' error wrapping one ("... (os error 28)"), as an OSError naming `path`: a full disk
    is then one line naming what could not be written (`storage_failure`)."""
    try:
        yield
    except OSError as error:
        if error.filename is None and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
    except SafetensorError as error:
        found = re.search(r"os error (\d+)", str(error))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from error


def storage_failure(error: OSError) -> str | None:
    """One line for an OSError of the machine's storage (`STORAGE_ERRNOS`): the file and the reason;
    None for any other OSError, which is a bug and keeps its traceback."""
    if error.errno not in STORAGE_ERRNOS:
        return None
    where = f"{error.filename}: " if error.filename is not None else ""
    return (f"{where}{error.strerror or os.strerror(error.errno)}; free space or choose a folder you can write to, "
            f"and run again (a file or checkpoint is published whole or not at all)")


@contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "w") -> Iterator:
    """Open a temporary file beside `path` for writing ("w" text, "wb" bytes); on success it replaces
    `path`, on an exception it is removed and `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with naming_failures(path), os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
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
