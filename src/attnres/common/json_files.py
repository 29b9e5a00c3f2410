"""Reading a JSON file that must hold an object (a config.json, a tokenizer_config.json, a shard index),
refused in one line of one form whatever the file's problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnres.common.errors import InputError

CONFIG_FILE = "config.json"
# What a JSON document holds instead of an object, in JSON's words (the reader's messages)
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


class JSONFileError(InputError):
    """A JSON file that is missing, unreadable, not JSON or not an object; the message names the file and
    the problem: "<what>: <path> <problem>[; <hint>]"."""


def read_json_object(path: str | os.PathLike[str], what: str, hint: str = "",
                     error: type[InputError] = JSONFileError) -> dict:
    """The JSON object file `path` holds. Raises `error` (JSONFileError unless a package gives its own
    exception type, e.g. ConversionError, so that its callers keep catching one type) as
    "<what>: <path> does not exist / cannot be read (...) / is not valid JSON (...) / must hold a
    JSON object, got an array", followed by "; <hint>" (what would work) when given."""
    path = Path(path)
    problem = None
    if not path.is_file():
        problem = "is a folder, not a file" if path.is_dir() else "does not exist"
    else:
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; RecursionError: nesting too deep to parse
        except (ValueError, RecursionError) as exc:
            problem = f"is not valid JSON ({exc})"
        else:
            if not isinstance(values, dict):
                problem = f"must hold a JSON object, got {_JSON_KINDS[type(values)]}"
    if problem is not None:
        raise error(f"{what}: {path} {problem}" + (f"; {hint}" if hint else ""))
    return values
