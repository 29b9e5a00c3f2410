"""One process per run directory: an exclusive OS file lock, held while a process writes into it.

The lock is `flock` on `<directory>/.attnres.lock`, so the kernel releases it when the process
ends, however it ends: a killed run never leaves a stale lock (only, at most, the file, which the
next holder takes over). The file keeps the holder's pid for the message a second process gets, and
is removed when the holder lets go.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnres.common.errors import InputError

LOCK_FILE = ".attnres.lock"

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are not protected against a second process
    fcntl = None


class RunDirectoryBusy(InputError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """An exclusive lock on `directory` (created if missing). `acquire()` raises RunDirectoryBusy at
    once, naming the directory and the holder's pid, when another process holds it. Also a context
    manager."""

    def __init__(self, directory: str | os.PathLike, field: str = "out_dir") -> None:
        self.directory, self.field = Path(directory), field
        self._handle = None
        self._created: list[Path] = []

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self) -> RunLock:
        if self.held:
            return self
        # the folders this makes, deepest first: those still empty on release are removed
        self._created = [d for d in (self.directory, *self.directory.parents) if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK_FILE
        while True:
            handle = open(path, "a+")
            if fcntl is None:
                break
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise RunDirectoryBusy(f"{self.field} {self.directory} is in use by another attnres process (pid "
                                       f"{holder}); wait for it to finish, or choose another {self.field}") from None
            # The holder we waited on may have removed the file as it released it: then this lock is
            # on a file no one else will open, so take the one now at the path.
            if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
            handle.close()
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding it) and let go; the folders that acquiring
        created go too where they stayed empty."""
        if not self.held:
            return
        (self.directory / LOCK_FILE).unlink(missing_ok=True)
        self._handle.close()  # closing the file releases the flock
        self._handle = None
        for folder in self._created:  # nothing was written there: leave nothing behind
            if any(folder.iterdir()):
                break
            folder.rmdir()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        if self._handle is not None:
            self._handle.close()
