"""Render the pages: every generated block of README.md and docs/**/*.md from its result files."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from attnres.common.atomic import write_atomic
from attnres.common.errors import InputError
from tools.pages.markers import MarkerError, find_blocks, replace_blocks
from tools.pages.sources import Results, ResultMissing


class PageError(InputError):
    """A page that cannot be rendered or differs from its result files (the message names page and block)."""


@dataclass
class Context:
    """What a block's generator sees: the result files, and the page it writes into (for relative links)."""

    results: Results
    page: str  # repository-relative path of the page, e.g. "docs/explanation/results.md"

    def link(self, target: str) -> str:
        """`target` (repository-relative) as a link relative to the page."""
        return Path(os.path.relpath(target, Path(self.page).parent)).as_posix()

    def source(self, relative: str) -> str:
        """A Markdown link to the result file `results/relative` (ResultMissing when it does not exist)."""
        self.results.path(relative)
        target = f"results/{relative}"
        return f"[`{target}`]({self.link(target)})"


def pages(root: Path) -> list[Path]:
    """The pages: README.md and every Markdown file under docs/ (result folders live under results/)."""
    root = Path(root)
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").rglob("*.md"))


def render_pages(root: Path) -> dict[Path, tuple[str, str]]:
    """Every page with generated blocks: path -> (current text, text with its blocks regenerated).

    PageError names the page and block of an unknown block name, unpaired markers, a missing result
    file, or a generator that fails on its result file."""
    from tools.pages.registry import BLOCKS  # the generators import the report code; only rendering needs them

    root = Path(root)
    results = Results(root)
    out = {}
    for path in pages(root):
        text = path.read_text()
        rel = path.relative_to(root).as_posix()
        try:
            blocks = find_blocks(text)
        except MarkerError as error:
            raise PageError(f"{rel}: {error}") from None
        if not blocks:
            continue
        contents = {}
        for block in blocks:
            if block.name not in BLOCKS:
                raise PageError(f"{rel}: unknown generated block {block.name!r}; known: {sorted(BLOCKS)}")
            try:
                contents[block.name] = BLOCKS[block.name](Context(results, rel))
            except (ResultMissing, InputError) as error:  # a bad result file; a bug keeps its traceback
                raise PageError(f"{rel}, block {block.name!r}: {error}") from error
        out[path] = (text, replace_blocks(text, contents))
    return out


def check_pages(root: Path) -> list[str]:
    """The pages whose generated blocks differ from what their result files say (empty: all current).
    A figure that differs only by rounding (`same_to_rounding`) is current."""
    stale = []
    for path, (text, new) in render_pages(root).items():
        if not same_to_rounding(text, new):
            names = [b.name for b, nb in zip(find_blocks(text), find_blocks(new))
                     if not same_to_rounding(text[b.start:b.end], new[nb.start:nb.end])]
            stale.append(f"{path.relative_to(root).as_posix()}: {', '.join(names)}")
    return stale


# A decimal number, with its sign (a page writes minus as "-" or as U+2212).
_DECIMAL = re.compile(r"([-+\u2212]?\d+\.\d+)")


def same_to_rounding(old: str, new: str) -> bool:
    """Whether two texts are the same but for decimal numbers printed with the same number of digits
    that differ by at most one unit of their last digit.

    A page's figures are computed from result files on whatever machine checks the pages, and the
    arithmetic behind one (numpy's exp or log, say) may round differently on another CPU's kernels, so
    a value next to a rounding boundary can print one unit apart there. Whole numbers (counts, steps,
    seeds) must match exactly."""
    if old == new:
        return True
    old_parts, new_parts = _DECIMAL.split(old), _DECIMAL.split(new)
    if len(old_parts) != len(new_parts):
        return False
    for i, (a, b) in enumerate(zip(old_parts, new_parts)):
        if a == b:
            continue
        if i % 2 == 0:  # the text between numbers differs
            return False
        digits = len(a.split(".")[1])
        if len(b.split(".")[1]) != digits:
            return False
        x, y = (float(v.replace("\u2212", "-")) for v in (a, b))
        if abs(x - y) > 1.5 * 10.0 ** -digits:  # one unit, with room for the float's own rounding
            return False
    return True


def write_pages(root: Path) -> list[Path]:
    """Regenerate every generated block in place (atomically); the pages that changed."""
    changed = []
    for path, (text, new) in render_pages(root).items():
        if not same_to_rounding(text, new):  # a page is not rewritten for another machine's rounding
            write_atomic(path, new)
            changed.append(path)
    return changed
