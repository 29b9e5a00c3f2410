"""The default corpus: the King James Bible, one document per chapter, from Debian's packages.

Debian ships the text (`bible-kjv-text`) and a reader (`bible-kjv`); `apt-get download` fetches
both from the configured Debian mirror without installing anything, so the corpus needs no other
network access. It is built once into the cache as JSON lines `{"id": "Genesis 1", "text": ...}`.
Elsewhere (no apt-get or dpkg-deb) every failure names the other sources: `ALTERNATIVES`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from attnres.common.atomic import atomic_file
from attnres.data.errors import DataError

DEMO_FILENAME = "kjv-chapters.jsonl"
PACKAGES = ("bible-kjv", "bible-kjv-text")
WHOLE_TEXT = "Gen1:1-Rev22:21"
_HEADER = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]* \d+$")
_VERSE = re.compile(r"^\s+\d+ (.*)$")
_TIMEOUT_S = 300
# What every failure here ends with: the sources that need no Debian tools (DataConfig.source).
ALTERNATIVES = ("train on other text instead: set data.source to a local .txt, .jsonl or .parquet file or a "
                "folder of them (e.g. --set data.source=./corpus.jsonl, one {\"text\": ...} object a line), or to a "
                "Hugging Face dataset as hf:<name> (e.g. --set data.source=hf:roneneldan/TinyStories "
                "--set data.max_documents=20000)")


def ensure_demo_corpus(cache_dir: Path) -> Path:
    """Path of the demo corpus (`<cache_dir>/demo/kjv-chapters.jsonl`), building it on first use.

    ~1189 documents (one per chapter, id like "Genesis 1"), ~4 MB. Raises DataError when the
    Debian packages cannot be fetched or read.
    """
    target = Path(cache_dir) / "demo" / DEMO_FILENAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    chapters = _build()
    with atomic_file(target, "w") as out:
        for doc_id, text in chapters:
            out.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    return target


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
        _download(root)
        for deb in sorted(root.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)], "unpacking " + deb.name)
        reader = root / "usr" / "bin" / "bible"
        if not reader.is_file():
            raise DataError(f"demo corpus: {reader.relative_to(root)} missing from the unpacked packages "
                            f"{', '.join(PACKAGES)}; {ALTERNATIVES}")
        output = _run([str(reader), "-p", str(root / "usr" / "lib"), WHOLE_TEXT], "running the bible reader")
    chapters = parse_bible_output(output)
    if len(chapters) < 1000:
        raise DataError(f"demo corpus: the bible reader printed {len(chapters)} chapters, expected 1189; "
                        f"{ALTERNATIVES}")
    return chapters


def _download(directory: Path) -> None:
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise DataError(f"the demo corpus (data.source 'demo') is built from Debian's packages "
                        f"{', '.join(PACKAGES)} with apt-get and dpkg-deb (Debian or Ubuntu), and "
                        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH; {ALTERNATIVES}")
    command = ["apt-get", "download", *PACKAGES]
    try:
        _run(command, "downloading " + ", ".join(PACKAGES), cwd=directory)
    except DataError:
        # A fresh container often has no package lists yet; refresh them once and retry.
        _run(["apt-get", "update", "-qq"], "refreshing the apt package lists (apt-get update)")
        _run(command, "downloading " + ", ".join(PACKAGES), cwd=directory)


def _run(command: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, encoding="utf-8",
                              errors="replace", timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataError(f"demo corpus: {what} failed ({exc}); {ALTERNATIVES}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DataError(f"demo corpus: {what} failed (exit {done.returncode}: {' | '.join(detail)}); "
                        f"{ALTERNATIVES}")
    return done.stdout
