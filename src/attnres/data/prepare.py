"""prepare_data: config -> tokenizer + train/validation(/test) token streams, reusing the cache when it can.

Cache layout under `DataConfig.cache_root()`:
  demo/kjv-chapters.jsonl      the demo corpus
  tokenizers/<key>/            trained BPEs, key = source identity + vocab_size + split parameters
  tokens/<key>.bin, .json      token streams, key = source identity + split + tokenizer fingerprint
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnres.common.atomic import publish
from attnres.common.run_options import check_out_dir
from attnres.data.data_config import CACHE_ENV, DataConfig
from attnres.data.data_error import DataError
from attnres.data.hashing import cache_key
from attnres.data.packing import TokenCache, stream_digest
from attnres.data.sources import describe_source, iter_documents, source_identity
from attnres.data.split import split_of
from attnres.data.tokenizer import TOKENIZER_FILE, Tokenizer, train_bpe

SPLITS = ("train", "val", "test")  # test only when DataConfig.test_fraction > 0
_BPE_VERSION = 2  # bump when train_bpe or the saved files change (2: pad_token declared), so old caches are not reused


@dataclass
class PreparedData:
    """Result of prepare_data: `train_tokens`/`val_tokens`/`test_tokens` are 1-D uint16/uint32
    (memmapped) streams, each document followed by `tokenizer.eos_id`; `test_tokens` is None without
    a test split. `stats` holds documents and tokens per split, the source description, vocab size,
    tokenizer fingerprint, each split's digest (`<split>_digest`) and whether the cache was reused."""

    tokenizer: Tokenizer
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    stats: dict[str, Any] = field(default_factory=dict)
    test_tokens: np.ndarray | None = None


def prepare_data(config: DataConfig, run_dir: str | os.PathLike[str] | None = None) -> PreparedData:
    """Read, split, tokenise and cache the corpus of `config`; save the tokenizer to `run_dir/tokenizer`.

    Documents are read at most once. A second call with the same source, split parameters,
    max_documents and tokenizer reads no documents, trains nothing and tokenises nothing.
    Raises DataError for an empty corpus or an empty train/validation/test split.
    """
    root = config.cache_root()
    named = ("data.cache_dir" if config.cache_dir is not None
             else f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the data cache")
    check_out_dir(root, named)  # before anything is read or written: one line naming the path
    identity = source_identity(config)
    split_params = {"val_fraction": float(config.val_fraction), "salt": config.split_salt}
    if config.test_fraction:  # absent at 0, so the caches made before the test split existed stay valid
        split_params["test_fraction"] = float(config.test_fraction)
    splits = SPLITS if config.test_fraction else SPLITS[:2]
    tokenizer, documents = _tokenizer(config, root, identity, split_params)
    cache = TokenCache(root / "tokens")
    keys = {name: cache_key({"source": identity, "split": name, **split_params, "tokenizer": tokenizer.fingerprint})
            for name in splits}
    missing = [name for name in splits if cache.metadata(keys[name]) is None]
    if missing:
        labelled = documents if documents is not None else _labelled(config)
        _write_splits(labelled, cache, keys, missing, tokenizer, config)
    loaded = {}
    for name in splits:
        result = cache.load(keys[name])
        if result is None:
            raise DataError(f"token cache: the {name} stream {cache.tokens_path(keys[name])} is missing or "
                            "incomplete right after it was written (is another process clearing the cache?)")
        loaded[name] = result
    if run_dir is not None:
        tokenizer.save(Path(run_dir) / "tokenizer")
    stats = {"source": describe_source(config), "vocab_size": tokenizer.vocab_size,
             "tokenizer": config.tokenizer, "tokenizer_fingerprint": tokenizer.fingerprint,
             "reused_cache": not missing and documents is None}
    for name in splits:
        stats[f"{name}_documents"] = int(loaded[name][1]["documents"])
        stats[f"{name}_tokens"] = int(loaded[name][1]["length"])
        stats[f"{name}_digest"] = stream_digest(*loaded[name])
    test = loaded["test"][0] if "test" in loaded else None
    return PreparedData(tokenizer, loaded["train"][0], loaded["val"][0], stats, test)


def _labelled(config: DataConfig) -> Iterable[tuple[str, str]]:
    for doc in iter_documents(config):
        yield split_of(doc.id, config.val_fraction, config.split_salt, config.test_fraction), doc.text


def _tokenizer(config: DataConfig, root: Path, identity: dict[str, Any], split_params: dict[str, Any]
               ) -> tuple[Tokenizer, list[tuple[str, str]] | None]:
    """The tokenizer, and the documents when they had to be read to train it (so they are read once)."""
    if config.tokenizer != "bpe":
        return Tokenizer.load(config.tokenizer), None
    key = cache_key({"source": identity, **split_params, "vocab_size": config.vocab_size, "bpe": _BPE_VERSION})
    directory = root / "tokenizers" / key
    if (directory / TOKENIZER_FILE).is_file():
        return Tokenizer.load(directory), None
    documents = list(_labelled(config))
    _check_counts({name: sum(1 for split, _ in documents if split == name) for name in SPLITS}, config)
    tokenizer = train_bpe((text for split, text in documents if split == "train"), config.vocab_size)
    _save_atomic(tokenizer, directory)
    return tokenizer, documents


def _write_splits(documents: Iterable[tuple[str, str]], cache: TokenCache, keys: dict[str, str],
                  missing: list[str], tokenizer: Tokenizer, config: DataConfig) -> None:
    counts = dict.fromkeys(SPLITS, 0)
    with contextlib.ExitStack() as stack:
        # Each writer publishes on clean exit and discards its temporary file on an exception.
        writers = {name: stack.enter_context(cache.writer(keys[name], tokenizer, {
            "split": name, "source": describe_source(config), "tokenizer_fingerprint": tokenizer.fingerprint}))
            for name in missing}
        for name, text in documents:
            counts[name] += 1
            if name in writers:
                writers[name].add(text)
        _check_counts(counts, config)


def _check_counts(counts: dict[str, int], config: DataConfig) -> None:
    total = sum(counts.values())
    if total == 0:
        raise DataError(f"the source {config.source!r} yielded no documents (all files empty, or "
                        f"text_field={config.text_field!r} always empty?)")
    if counts["train"] == 0:
        held_out = "validation" if not config.test_fraction else "validation and test"
        raise DataError(f"the training split is empty: all {total} documents went to {held_out}; lower "
                        f"val_fraction (now {config.val_fraction}){' or test_fraction' if config.test_fraction else ''}"
                        f" or raise max_documents (now {config.max_documents})")
    if counts["val"] == 0:
        raise DataError(f"the validation split is empty: none of the {total} documents went to validation; raise "
                        f"val_fraction (now {config.val_fraction}) or max_documents (now {config.max_documents})")
    if config.test_fraction and counts["test"] == 0:
        raise DataError(f"the test split is empty: none of the {total} documents went to test; raise "
                        f"test_fraction (now {config.test_fraction}) or max_documents (now {config.max_documents})")


def _save_atomic(tokenizer: Tokenizer, directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        tokenizer.save(tmp)
        publish(tmp, directory)
    except OSError:
        # Another process published the same tokenizer first; theirs is identical.
        if not (directory / TOKENIZER_FILE).is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
