"""Generated blocks in a Markdown page: find them, and put new contents between their markers."""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnres.common.errors import InputError

BEGIN = "<!-- attnres:begin {name} -->"
END = "<!-- attnres:end {name} -->"
_MARKER = re.compile(r"^<!-- attnres:(begin|end) ([a-z0-9][a-z0-9-]*) -->[ \t]*$", re.MULTILINE)


class MarkerError(InputError):
    """A page whose markers do not pair up (the message names the line)."""


@dataclass(frozen=True)
class Block:
    """One generated block: its name, and the character span of its contents between the markers."""

    name: str
    start: int  # first character after the begin marker's line
    end: int  # first character of the end marker


def find_blocks(text: str) -> list[Block]:
    """Every generated block of `text`, in order; MarkerError for an unpaired or nested marker."""
    blocks, open_name, open_at = [], None, 0
    for match in _MARKER.finditer(text):
        kind, name = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        if kind == "begin":
            if open_name is not None:
                raise MarkerError(f"line {line}: block {name!r} begins inside block {open_name!r}")
            open_name, open_at = name, match.end() + 1
        else:
            if open_name != name:
                raise MarkerError(f"line {line}: end of block {name!r} without its begin marker")
            blocks.append(Block(name, min(open_at, match.start()), match.start()))
            open_name = None
    if open_name is not None:
        raise MarkerError(f"block {open_name!r} has no end marker ({END.format(name=open_name)})")
    return blocks


def replace_blocks(text: str, contents: dict[str, str]) -> str:
    """`text` with the contents of every block named in `contents` replaced (each ends with one newline)."""
    out, last = [], 0
    for block in find_blocks(text):
        if block.name in contents:
            out += [text[last:block.start], contents[block.name].rstrip("\n") + "\n"]
            last = block.end
    return "".join(out) + text[last:]


def outside_blocks(text: str) -> str:
    """`text` with every generated block's contents removed (the hand-written part of a page)."""
    return replace_blocks(text, {block.name: "" for block in find_blocks(text)})
