"""Atomic publication of cache files: written under a temporary name, then renamed into place."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def publish(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename the finished file or directory `tmp` to `target` (atomic on one filesystem).

    mkstemp/mkdtemp create owner-only entries; a cache is meant to be readable like any file.
    """
    os.chmod(tmp, 0o755 if Path(tmp).is_dir() else 0o644)
    os.replace(tmp, target)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as JSON to `path` so that readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
