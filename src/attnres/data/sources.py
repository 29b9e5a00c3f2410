"""Documents from the configured source: a built-in corpus, local files, or a streamed `datasets` dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.data.data_config import SOURCE_HELP, DataConfig
from attnres.data.demo_corpus import ensure_demo_corpus
from attnres.data.data_error import DataError
from attnres.data.hashing import digest
from attnres.data.python_docs import ensure_python_docs

EXTENSIONS = (".txt", ".jsonl", ".parquet")
FINEWEB_EDU_PATH = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_CONFIG = "sample-10BT"
# `datasets` has no loader for a bare data file, only packaged builders given `data_files`.
_HF_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
_PARQUET_BATCH = 1024


@dataclass(frozen=True)
class Document:
    """One document: a stable `id` (decides its split) and its `text`."""

    id: str
    text: str


@dataclass(frozen=True)
class HFSource:
    """Arguments of `datasets.load_dataset(path, name, split=split, data_files=data_files, streaming=True)`."""

    path: str
    name: str | None
    split: str
    data_files: str | None = None


def hf_source(config: DataConfig) -> HFSource | None:
    """The `datasets` call behind `config.source`, or None for the demo corpus and local paths.

    "fineweb-edu" is HuggingFaceFW/fineweb-edu with config sample-10BT (or `hf_config`); "hf:X"
    is dataset X (hub name or local dataset dir), or, when X is a data file, the matching packaged
    builder ("json", "parquet", "csv", "text") with `data_files=X`.
    """
    if config.source == "fineweb-edu":
        return HFSource(FINEWEB_EDU_PATH, config.hf_config or FINEWEB_EDU_CONFIG, config.hf_split)
    if not config.source.startswith("hf:"):
        return None
    target = config.source[3:].strip()
    local = Path(target).expanduser()
    if local.is_file():
        builder = _HF_FILE_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise DataError(f"DataConfig.source {config.source!r}: no `datasets` builder for {local.suffix!r} "
                            f"files; allowed data file extensions: {sorted(_HF_FILE_BUILDERS)}")
        return HFSource(builder, config.hf_config, config.hf_split, data_files=str(local.resolve()))
    if local.is_dir():
        target = str(local.resolve())
    return HFSource(target, config.hf_config, config.hf_split)


def local_source(config: DataConfig) -> Path | None:
    """The local file or folder behind `config.source` (building a built-in corpus), or None for `datasets`."""
    if hf_source(config) is not None:
        return None
    if config.source == "demo":
        return ensure_demo_corpus(config.cache_root())
    if config.source == "python-docs":
        return ensure_python_docs(config.cache_root())
    path = Path(config.source).expanduser()
    if not path.exists():
        raise DataError(f"DataConfig.source: no such file or directory: {str(path)!r} (source must be {SOURCE_HELP})")
    return path.resolve()


def local_files(root: Path) -> list[Path]:
    """The document files of a local source: `root` itself, or every .txt/.jsonl/.parquet file under
    the folder `root`, recursively, in sorted path order (hidden files and other extensions skipped)."""
    if root.is_file():
        if root.suffix.lower() not in EXTENSIONS:
            raise DataError(f"DataConfig.source: unsupported file extension {root.suffix!r} for {str(root)!r}; "
                            f"allowed: {', '.join(EXTENSIONS)} (or a folder of them)")
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise DataError(f"DataConfig.source: no {', '.join(EXTENSIONS)} files under the folder {str(root)!r}")
    return files


def iter_documents(config: DataConfig) -> Iterator[Document]:
    """Documents of `config.source` in source order, empty texts skipped, at most `max_documents`.

    Raises DataError for a missing path, an unsupported extension, a record without
    `config.text_field`, or a `datasets` dataset that cannot be loaded.
    """
    remote = hf_source(config)
    documents = _hf_documents(remote, config) if remote is not None else _local_documents(config)
    count = 0
    for doc in documents:
        if not doc.text.strip():
            continue
        yield doc
        count += 1
        if config.max_documents is not None and count >= config.max_documents:
            return


def describe_source(config: DataConfig) -> str:
    """One line saying where the documents come from (for logs and stats)."""
    remote = hf_source(config)
    if remote is not None:
        what = remote.data_files or remote.path
        return f"datasets:{what} (config={remote.name}, split={remote.split})"
    if config.source == "demo":
        return "demo: King James Bible, one document per chapter (Debian bible-kjv-text)"
    if config.source == "python-docs":
        return "python-docs: Python 3.11 documentation, reStructuredText, one document per page (Debian python3.11-doc)"
    return f"local:{config.source}"


def source_identity(config: DataConfig) -> dict[str, Any]:
    """JSON-able description of the documents `iter_documents(config)` yields, for cache keys.

    Local files are described by relative path, size and mtime, so editing a file invalidates
    caches; hub datasets by name, config and split only (a dataset updated in place on the hub
    is not noticed: clear the cache or change `split_salt`).
    """
    identity: dict[str, Any] = {"text_field": config.text_field, "id_field": config.id_field,
                                "max_documents": config.max_documents}
    remote = hf_source(config)
    if remote is not None:
        identity.update(kind="datasets", path=remote.path, name=remote.name, split=remote.split,
                        data_files=_file_stats(Path(remote.data_files)) if remote.data_files else None)
        local = Path(remote.path)
        if local.is_absolute() and local.is_dir():
            identity["files"] = _file_stats(local)
        return identity
    root = local_source(config)
    identity.update(kind="local", root=str(root), files=_file_stats(root))
    return identity


def _file_stats(root: Path) -> list[list[Any]]:
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    stats = []
    for path in paths:
        stat = path.stat()
        name = path.name if path == root else path.relative_to(root).as_posix()
        stats.append([name, stat.st_size, stat.st_mtime_ns])
    return stats


def _local_documents(config: DataConfig) -> Iterator[Document]:
    root = local_source(config)
    assert root is not None
    for path in local_files(root):
        suffix = path.suffix.lower()
        if suffix == ".txt":
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{str(path)!r} is not valid UTF-8 text ({exc})") from exc
            yield Document(path.name if path == root else path.relative_to(root).as_posix(), text)
        elif suffix == ".jsonl":
            yield from _jsonl_documents(path, config)
        else:
            yield from _parquet_documents(path, config)


def _jsonl_documents(path: Path, config: DataConfig) -> Iterator[Document]:
    with path.open("r", encoding="utf-8") as lines:
        number = 0
        try:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as exc:  # JSONDecodeError, a number of > 4300 digits, deep nesting
                    raise DataError(f"{path}:{number}: invalid JSON ({exc})") from None
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
                yield _document(record, config, f"{path}:{number}")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}:{number + 1}: not valid UTF-8 text ({exc})") from None


def _parquet_documents(path: Path, config: DataConfig) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        if config.text_field not in names:
            raise DataError(f"{path}: no column {config.text_field!r} (DataConfig.text_field); columns: {names}")
        columns = [config.text_field] + ([config.id_field] if config.id_field in names else [])
        for batch in table.iter_batches(batch_size=_PARQUET_BATCH, columns=columns):
            texts = batch.column(config.text_field).to_pylist()
            ids = batch.column(config.id_field).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for text, doc_id in zip(texts, ids):
                yield _document({config.text_field: text, config.id_field: doc_id}, config, str(path))
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # not parquet, truncated, corrupt pages
        raise DataError(f"{path} is not a readable parquet file ({exc}); write it again, or give the .jsonl or .txt "
                        f"files it came from") from None


def _hf_documents(source: HFSource, config: DataConfig) -> Iterator[Document]:
    import datasets

    try:
        dataset = datasets.load_dataset(source.path, source.name, split=source.split,
                                        data_files=source.data_files, streaming=True)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types (hub, file, config errors)
        raise DataError(f"could not load the datasets dataset {source.data_files or source.path!r} "
                        f"(config={source.name!r}, split={source.split!r}): {type(exc).__name__}: {exc}") from exc
    for number, record in enumerate(dataset):
        yield _document(record, config, f"{source.data_files or source.path} record {number}")


def _document(record: dict[str, Any], config: DataConfig, where: str) -> Document:
    if config.text_field not in record:
        raise DataError(f"{where}: record has no field {config.text_field!r} (DataConfig.text_field); "
                        f"fields: {sorted(record)}")
    text = record[config.text_field]
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise DataError(f"{where}: field {config.text_field!r} must be a string, got {type(text).__name__}")
    doc_id = record.get(config.id_field)
    # Without an id, the text itself identifies the document: identical texts land in one split.
    return Document(str(doc_id) if doc_id is not None else "blake2b:" + digest(text), text)
