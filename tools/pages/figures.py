"""Measured figures written by hand: a page's text outside its generated blocks, code and links, scanned
for what reads as a measurement (a ratio like 1.14x, an interval ±, a signed difference, a time, a size,
a speed, a loss in nats, a percentage, a test count). Every such figure belongs in a generated block.

A line may quote one by naming its source file in a comment on the same line,
`<!-- source: results/NAME/FILE -->`; the file must exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.pages.markers import find_blocks
from tools.pages.render import pages

NUMBER = r"\d+(?:[.,]\d+)*"
MEASUREMENT = re.compile("|".join([
    rf"(?<![\w.]){NUMBER}\.\d+\s?[x×](?![\w])",                     # a ratio: 1.14x
    r"±",                                                              # an interval
    rf"(?<![\w.^])[+\-−]\d+\.\d+",                                       # a signed difference: -0.173
    rf"(?<![\w.]){NUMBER}\s?(?:ms|µs|us|s|sec|seconds?|minutes?|min|hours?|days?)\b",  # a time
    rf"(?<![\w.]){NUMBER}\s?(?:[KMGT]i?B|[KMGT]B/s|GB/s|tokens/s|tok/s|it/s)\b",     # a size or a speed
    rf"(?<![\w.]){NUMBER}\s?nats?\b",                                   # a loss difference
    rf"(?<![\w.]){NUMBER}\s?%(?!\s?(?:interval|CI|confidence|bootstrap|paired|distribution-free))",  # a share
    rf"(?<![\w.]){NUMBER}\s+tests\b",                                   # a test count
]))
SOURCE = re.compile(r"<!-- source: (results/[^ ]+) -->")
FENCE = re.compile(r"^(```|~~~)")


@dataclass(frozen=True)
class Finding:
    """A measured figure written by hand: page, line number, the figure and its line."""

    page: str
    line: int
    figure: str
    text: str

    def __str__(self) -> str:
        return (f"{self.page}:{self.line}: hand-written figure {self.figure!r} ({self.text.strip()[:80]}); "
                "generate it from a result file (tools.pages) or name its source file")


def _prose(line: str) -> str:
    """A line without inline code, link targets and HTML comments (what a reader reads as prose)."""
    line = re.sub(r"`[^`]*`", "", line)
    line = re.sub(r"\]\([^)]*\)", "]", line)
    return re.sub(r"<!--.*?-->", "", line)


def generated_lines(text: str) -> set[int]:
    """The 1-based line numbers of every generated block's contents."""
    lines = set()
    for block in find_blocks(text):
        first = text.count("\n", 0, block.start) + 1
        lines.update(range(first, first + text.count("\n", block.start, block.end)))
    return lines


def scan(text: str, page: str, root: Path) -> list[Finding]:
    """The hand-written measured figures of one page's text."""
    generated, findings, in_code = generated_lines(text), [], False
    for number, line in enumerate(text.splitlines(), 1):
        if number in generated:
            continue
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        source = SOURCE.search(line)
        if in_code or (source and (root / source.group(1)).is_file()):
            continue
        findings += [Finding(page, number, m.group(0), line) for m in MEASUREMENT.finditer(_prose(line))]
    return findings


def handwritten_figures(root: Path) -> list[Finding]:
    """Every hand-written measured figure in README.md and docs/**/*.md."""
    root = Path(root)
    out = []
    for path in pages(root):
        out += scan(path.read_text(), path.relative_to(root).as_posix(), root)
    return out
