"""Paths as a shell user writes them: `~` and `~user` expanded wherever attnres reads a path the user
gave (a config's out_dir, `--out`), an empty one refused by name instead of read as the working
directory, and a symlink that leads nowhere named as such."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from attnres.common.errors import InputError


def user_path(value: str | os.PathLike[str], name: str, error: type[Exception] = InputError) -> Path:
    """`value` as a Path with `~` / `~user` expanded; `error` naming `name` for an empty path (which
    would mean the working directory), one of blanks, a `~user` with no such user, or no path at all."""
    if not isinstance(value, (str, os.PathLike)):
        raise error(f"{name} must be a path, got {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise error(f"{name} must be a path given as text, got {value!r}")
    if not text.strip():
        raise error(f"{name} is empty; give a path (an empty one would mean the working directory: write . for it)")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = expanded[1:].split(os.sep, 1)[0]
        raise error(f"{name} {text}: there is no user {user!r} whose home folder ~{user} could name; "
                    f"give the full path")
    return Path(expanded)


def user_path_text(value: str | os.PathLike[str], name: str, error: type[Exception] = InputError) -> str:
    """`user_path` as a string, for a config field that keeps paths as text."""
    return str(user_path(value, name, error))


def unexpanded_home(path: str | os.PathLike[str]) -> bool:
    """Whether `path` begins with a `~` that nothing expanded (e.g. `--out=~/x`, which a shell leaves
    as written): used literally it would make a folder named `~` here."""
    parts = Path(path).parts
    return bool(parts) and parts[0].startswith("~")


def broken_link(path: Path) -> str | None:
    """What is wrong with `path` where it is a symlink that leads to nothing ("a symlink to X, which
    does not exist", "a symlink loop"); None for anything else (a working link, no link, nothing)."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as failure:
        if failure.errno == errno.ELOOP:
            return f"a symlink loop ({path} -> {os.readlink(path)})"
        return f"a symlink to {os.readlink(path)}, which does not exist"
    return None
