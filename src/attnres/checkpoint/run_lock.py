"""One process per run directory: an exclusive OS file lock, held while a process writes into it
(or one process per shard, where the shards of a sweep share a folder).

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
    """A lock on `directory` (created if missing) for one process, or for one shard of a sharded sweep.

    shard=(0, 1), the default: an exclusive lock on the whole folder. shard=(i, n) with n > 1: a
    shared lock on the folder, which the other shards hold too, and an exclusive one on the shard's
    own file (`.attnres.shard-i-of-n.lock`): shards run side by side, while a second process for the
    same shard, or an unsharded one, stops at once. `acquire()` raises RunDirectoryBusy then, naming
    the directory and the holder's pid where it is known. `field` names the directory in messages
    ("out_dir", "--out"). Also a context manager."""

    def __init__(self, directory: str | os.PathLike, field: str = "out_dir", shard: tuple[int, int] = (0, 1)) -> None:
        self.directory, self.field, self.shard = Path(directory), field, tuple(shard)
        self._handles: list[tuple[Path, object, bool]] = []  # (path, open file, exclusive)
        self._created: list[Path] = []

    @property
    def held(self) -> bool:
        return bool(self._handles)

    def acquire(self) -> RunLock:
        if self.held:
            return self
        # the folders this makes, deepest first: those still empty on release are removed
        self._created = [d for d in (self.directory, *self.directory.parents) if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        index, count = self.shard
        try:
            self._take(self.directory / LOCK_FILE, exclusive=count == 1)
            if count > 1:
                self._take(self.directory / f".attnres.shard-{index}-of-{count}.lock", exclusive=True,
                           what=f" for shard {index}/{count}")
        except BaseException:
            self.release()
            raise
        return self

    def _take(self, path: Path, exclusive: bool, what: str = "") -> None:
        while True:
            handle = open(path, "a+")
            if fcntl is None:
                break
            try:
                fcntl.flock(handle.fileno(), (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                by = f"another attnres process (pid {holder})" if holder else "the shards of a sharded attnres run"
                raise RunDirectoryBusy(f"{self.field} {self.directory} is in use{what} by {by}; wait for it to "
                                       f"finish, or choose another {self.field}") from None
            # The holder we waited on may have removed the file as it released it: then this lock is
            # on a file no one else will open, so take the one now at the path.
            if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
            handle.close()
        if exclusive:  # a shared holder writes nothing: the pid is the one exclusive holder's
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        self._handles.append((path, handle, exclusive))

    def release(self) -> None:
        """Remove each lock file this process alone holds (while holding it) and let go; the folders
        that acquiring created go too where they stayed empty."""
        for path, handle, exclusive in reversed(self._handles):
            if not exclusive and fcntl is not None:  # the last shard out removes the shared file
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    exclusive = True
                except BlockingIOError:
                    pass
            if exclusive:
                path.unlink(missing_ok=True)
            handle.close()  # closing the file releases the flock
        self._handles = []
        for folder in self._created:  # nothing was written there: leave nothing behind
            if not folder.exists():
                continue
            if any(folder.iterdir()):
                break
            folder.rmdir()
        self._created = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        for _, handle, _ in getattr(self, "_handles", []):
            handle.close()
