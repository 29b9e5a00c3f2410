"""Fetch and unpack Debian packages without installing them: the built-in corpora's one network need.

`apt-get download` takes packages from the configured Debian mirror and `dpkg-deb -x` unpacks them
into a folder, so nothing is installed and no root is needed beyond what apt-get download needs.
Every failure is a DataError that names the corpus and ends with `ALTERNATIVES`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from attnres.common.atomic import atomic_file
from attnres.data.data_error import DataError

TIMEOUT_S = 300
# What every failure here ends with: the sources that need no Debian tools (DataConfig.source).
ALTERNATIVES = ("train on other text instead: set data.source to a local .txt, .jsonl or .parquet file or a "
                "folder of them (e.g. --set data.source=./corpus.jsonl, one {\"text\": ...} object a line), or to a "
                "Hugging Face dataset as hf:<name> (e.g. --set data.source=hf:roneneldan/TinyStories "
                "--set data.max_documents=20000)")


def documents_once(target: Path, build: Callable[[], list[tuple[str, str]]]) -> Path:
    """`target`, written once as JSON lines {"id", "text"} from build()'s (id, text) pairs; kept after that."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    documents = build()
    with atomic_file(target, "w") as out:
        for doc_id, text in documents:
            out.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    return target


def unpack_packages(packages: tuple[str, ...], directory: Path, corpus: str, source: str) -> None:
    """Download `packages` into `directory` and unpack each there (its files under directory/usr/...).

    corpus: the corpus's name in messages ("demo corpus"); source: its data.source value ("demo").
    """
    download(packages, directory, corpus, source)
    for deb in sorted(directory.glob("*.deb")):
        run(["dpkg-deb", "-x", str(deb), str(directory)], "unpacking " + deb.name, corpus)


def download(packages: tuple[str, ...], directory: Path, corpus: str, source: str) -> None:
    """`apt-get download packages` in `directory`, refreshing the package lists once if it fails."""
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise DataError(f"the {corpus} (data.source '{source}') is built from Debian's packages "
                        f"{', '.join(packages)} with apt-get and dpkg-deb (Debian or Ubuntu), and "
                        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH; {ALTERNATIVES}")
    command = ["apt-get", "download", *packages]
    try:
        run(command, "downloading " + ", ".join(packages), corpus, cwd=directory)
    except DataError:
        # A fresh container often has no package lists yet; refresh them once and retry.
        run(["apt-get", "update", "-qq"], "refreshing the apt package lists (apt-get update)", corpus)
        run(command, "downloading " + ", ".join(packages), corpus, cwd=directory)


def run(command: list[str], what: str, corpus: str, cwd: Path | None = None) -> str:
    """Run `command` and return its stdout; a DataError "<corpus>: <what> failed (...)" otherwise."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, encoding="utf-8",
                              errors="replace", timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataError(f"{corpus}: {what} failed ({exc}); {ALTERNATIVES}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DataError(f"{corpus}: {what} failed (exit {done.returncode}: {' | '.join(detail)}); {ALTERNATIVES}")
    return done.stdout
