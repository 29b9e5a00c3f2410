"""A second built-in corpus from another domain: the Python 3.11 documentation, one document per page.

Debian's `python3.11-doc` ships the documentation's reStructuredText sources beside its HTML
(`usr/share/doc/python3.11/html/_sources/**/*.rst.txt`): technical prose with code examples, far from
the demo corpus's 17th-century English. Each page's source is one document, as written (markup kept),
with its path as the id ("library/json"). The text is under the Python Software Foundation License
(the package's copyright file). Built once into the cache as JSON lines, like the demo corpus.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from attnres.data.debian_packages import ALTERNATIVES, documents_once, unpack_packages
from attnres.data.data_error import DataError

SOURCE = "python-docs"  # its DataConfig.source
PACKAGES = ("python3.11-doc",)
FILENAME = "python3.11-rst.jsonl"
SOURCES_DIR = Path("usr/share/doc/python3.11/html/_sources")
SUFFIX = ".rst.txt"
CORPUS = "python-docs corpus"  # how messages name it
MIN_PAGES = 400  # 3.11.2 has 497 pages: far fewer means the package changed shape


def ensure_python_docs(cache_dir: Path) -> Path:
    """Path of the corpus (`<cache_dir>/python-docs/python3.11-rst.jsonl`), building it on first use.

    About 500 documents (12 MB). Raises DataError when the package cannot be fetched or read.
    """
    target = Path(cache_dir) / SOURCE / FILENAME
    return documents_once(target, _build)


def read_pages(root: Path) -> list[tuple[str, str]]:
    """(id, text) of every page source under `root` (the unpacked _sources folder), in path order."""
    pages = []
    for path in sorted(root.rglob("*" + SUFFIX)):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            pages.append((path.relative_to(root).as_posix()[:-len(SUFFIX)], text))
    return pages


def _build() -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="attnres-pydoc-") as tmp:
        root = Path(tmp)
        unpack_packages(PACKAGES, root, CORPUS, SOURCE)
        pages = read_pages(root / SOURCES_DIR) if (root / SOURCES_DIR).is_dir() else []
    if len(pages) < MIN_PAGES:
        raise DataError(f"{CORPUS}: {len(pages)} page sources under {SOURCES_DIR} in {', '.join(PACKAGES)}, "
                        f"expected about 500; {ALTERNATIVES}")
    return pages
