"""The default corpus: the King James Bible, one document per chapter, from Debian's packages.

Debian ships the text (`bible-kjv-text`) and a reader (`bible-kjv`); `apt-get download` fetches
both from the configured Debian mirror without installing anything, so the corpus needs no other
network access. It is built once into the cache as JSON lines `{"id": "Genesis 1", "text": ...}`.
Elsewhere (no apt-get or dpkg-deb) every failure names the other sources: `ALTERNATIVES`.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from attnres.data.debian_packages import ALTERNATIVES, documents_once, run, unpack_packages
from attnres.data.data_error import DataError

DEMO_FILENAME = "kjv-chapters.jsonl"
PACKAGES = ("bible-kjv", "bible-kjv-text")
WHOLE_TEXT = "Gen1:1-Rev22:21"
_HEADER = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]* \d+$")
_VERSE = re.compile(r"^\s+\d+ (.*)$")
CORPUS = "demo corpus"  # how messages name it


def ensure_demo_corpus(cache_dir: Path) -> Path:
    """Path of the demo corpus (`<cache_dir>/demo/kjv-chapters.jsonl`), building it on first use.

    ~1189 documents (one per chapter, id like "Genesis 1"), ~4 MB. Raises DataError when the
    Debian packages cannot be fetched or read.
    """
    target = Path(cache_dir) / "demo" / DEMO_FILENAME
    return documents_once(target, lambda: _build())  # looked up now: a test may replace it


def parse_bible_output(text: str) -> list[tuple[str, str]]:
    """Split the output of `bible` into (chapter id, prose) pairs.

    The reader prints a chapter header ("Genesis 1") after a blank line, then verses
    ("  1 In the beginning ...") whose text may wrap onto unindented lines; verse numbers are
    dropped and wrapped lines joined, so a chapter becomes one paragraph of prose.
    """
    chapters: list[tuple[str, list[str]]] = []
    previous_blank = True
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            previous_blank = True
            continue
        verse = _VERSE.match(line)
        if verse:
            if not chapters:
                raise DataError(f"demo corpus: verse before any chapter header: {line!r}")
            chapters[-1][1].append(verse.group(1).strip())
        elif previous_blank and _HEADER.match(line):
            chapters.append((line, []))
        elif chapters and chapters[-1][1]:
            chapters[-1][1][-1] += " " + line.strip()
        else:
            raise DataError(f"demo corpus: unexpected line in the bible reader's output: {line!r}")
        previous_blank = False
    return [(chapter, " ".join(verses)) for chapter, verses in chapters if verses]


def _build() -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="attnres-kjv-") as tmp:
        root = Path(tmp)
        unpack_packages(PACKAGES, root, CORPUS, "demo")
        reader = root / "usr" / "bin" / "bible"
        if not reader.is_file():
            raise DataError(f"demo corpus: {reader.relative_to(root)} missing from the unpacked packages "
                            f"{', '.join(PACKAGES)}; {ALTERNATIVES}")
        output = run([str(reader), "-p", str(root / "usr" / "lib"), WHOLE_TEXT], "running the bible reader", CORPUS)
    chapters = parse_bible_output(output)
    if len(chapters) < 1000:
        raise DataError(f"demo corpus: the bible reader printed {len(chapters)} chapters, expected 1189; "
                        f"{ALTERNATIVES}")
    return chapters
