"""Documents -> one flat token stream (each document followed by EOS), cached on disk as a memmap."""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from attnres.common.atomic import publish, write_atomic
from attnres.data.data_error import DataError
from attnres.data.hashing import digest
from attnres.data.tokenizer import Tokenizer

CACHE_FORMAT = 1
# Bounds on the text held before a batched encode: big enough to keep the Rust threads busy,
# small enough that a huge corpus never sits in memory as Python lists of ids.
CHUNK_DOCUMENTS = 512
CHUNK_CHARS = 8_000_000


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65535), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def pack_documents(texts: Iterable[str], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    """The flat stream of `texts`, each followed by EOS, as consecutive 1-D chunks of token_dtype."""
    dtype = token_dtype(tokenizer.vocab_size)
    buffer: list[str] = []
    chars = 0
    for text in texts:
        buffer.append(text)
        chars += len(text)
        if len(buffer) >= CHUNK_DOCUMENTS or chars >= CHUNK_CHARS:
            yield _encode_chunk(buffer, tokenizer, dtype)
            buffer, chars = [], 0
    if buffer:
        yield _encode_chunk(buffer, tokenizer, dtype)


def _remove_orphans(root: Path, key: str) -> None:
    """Delete the temporary files of `key` left by writers on this host that were killed (their process
    is gone); a live writer's, or another host's, is kept."""
    host = socket.gethostname()
    for path in root.glob(f".{glob.escape(key)}-{glob.escape(host)}-*.tmp"):
        pid = path.name[len(f".{key}-{host}-"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stream_digest(tokens: np.ndarray, meta: dict[str, Any]) -> str:
    """The blake2b digest of a cached stream's bytes: from its metadata, or computed for a stream
    cached before digests were recorded."""
    return meta.get("digest") or digest(np.ascontiguousarray(tokens).tobytes(), size=16)


def _encode_chunk(texts: list[str], tokenizer: Tokenizer, dtype: np.dtype) -> np.ndarray:
    encoded = tokenizer.encode_batch(texts)
    eos = (tokenizer.eos_id,)
    total = sum(len(ids) for ids in encoded) + len(encoded)
    return np.fromiter(itertools.chain.from_iterable(itertools.chain(ids, eos) for ids in encoded),
                       dtype=dtype, count=total)


class TokenWriter:
    """Appends documents to a cached stream; the files appear only when the `with` block exits cleanly.

    Tokens go to a temporary file beside the target; on success it is renamed into place and the
    metadata JSON written last (also via rename), so a reader never sees a partial stream. On an
    exception the temporary file is removed and nothing is cached.
    """

    def __init__(self, cache: TokenCache, key: str, tokenizer: Tokenizer, extra: dict[str, Any] | None = None) -> None:
        self._cache, self._key, self._tokenizer = cache, key, tokenizer
        self._extra = dict(extra or {})
        self._dtype = token_dtype(tokenizer.vocab_size)
        self._texts: list[str] = []
        self._chars = 0
        self.documents = 0
        self.tokens = 0
        self._digest = hashlib.blake2b(digest_size=16)  # of the stream's bytes, so a changed corpus is seen
        cache.root.mkdir(parents=True, exist_ok=True)
        owner = f"{socket.gethostname()}-{os.getpid()}"  # a killed writer's file is found by this on the next run
        _remove_orphans(cache.root, key)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{key}-{owner}-", suffix=".tmp", dir=cache.root)
        self._file = os.fdopen(fd, "wb")

    def add(self, text: str) -> None:
        """Queue one document (tokenised in chunks)."""
        self._texts.append(text)
        self._chars += len(text)
        self.documents += 1
        if len(self._texts) >= CHUNK_DOCUMENTS or self._chars >= CHUNK_CHARS:
            self._flush()

    def _flush(self) -> None:
        if self._texts:
            chunk = _encode_chunk(self._texts, self._tokenizer, self._dtype)
            data = chunk.tobytes()
            self._file.write(data)
            self._digest.update(data)
            self.tokens += int(chunk.size)
            self._texts, self._chars = [], 0

    def commit(self) -> dict[str, Any]:
        """Finish the stream and publish it under its key; returns its metadata."""
        self._flush()
        self._file.close()
        publish(self._tmp, self._cache.tokens_path(self._key))
        meta = {"format": CACHE_FORMAT, "key": self._key, "dtype": self._dtype.name, "length": self.tokens,
                "documents": self.documents, "eos_id": self._tokenizer.eos_id, "digest": self._digest.hexdigest(),
                **self._extra}
        write_atomic(self._cache.meta_path(self._key), json.dumps(meta, indent=2, sort_keys=True))
        return meta

    def abort(self) -> None:
        """Drop everything written so far."""
        self._file.close()
        Path(self._tmp).unlink(missing_ok=True)

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


class TokenCache:
    """Token streams under `root`: `<key>.bin` (raw ids) and `<key>.json` (dtype, length, documents, key,
    digest: blake2b of the ids' bytes)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def tokens_path(self, key: str) -> Path:
        """Path of the raw token file of `key`."""
        return self.root / f"{key}.bin"

    def meta_path(self, key: str) -> Path:
        """Path of the metadata JSON of `key`."""
        return self.root / f"{key}.json"

    def metadata(self, key: str) -> dict[str, Any] | None:
        """Metadata of a complete cached stream, or None when absent, partial or of another format."""
        try:
            meta = json.loads(self.meta_path(key).read_text(encoding="utf-8"))
            size = self.tokens_path(key).stat().st_size
        except (OSError, json.JSONDecodeError):
            return None
        if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
            return None
        if size != int(meta["length"]) * np.dtype(meta["dtype"]).itemsize:
            return None
        return meta

    def load(self, key: str) -> tuple[np.ndarray, dict[str, Any]] | None:
        """(read-only memmap of shape (length,), metadata) of a cached stream, or None."""
        meta = self.metadata(key)
        if meta is None:
            return None
        dtype, length = np.dtype(meta["dtype"]), int(meta["length"])
        if length == 0:  # mmap cannot map an empty file
            return np.zeros(0, dtype=dtype), meta
        return np.memmap(self.tokens_path(key), dtype=dtype, mode="r", shape=(length,)), meta

    def writer(self, key: str, tokenizer: Tokenizer, extra: dict[str, Any] | None = None) -> TokenWriter:
        """A TokenWriter that publishes the stream of `key` when its `with` block exits cleanly."""
        return TokenWriter(self, key, tokenizer, extra)

    def load_or_build(self, key: str, texts: Callable[[], Iterable[str]], tokenizer: Tokenizer,
                      extra: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """The cached stream of `key`, tokenising `texts()` into the cache first when it is absent."""
        cached = self.load(key)
        if cached is not None:
            return cached
        with self.writer(key, tokenizer, extra) as out:
            for text in texts():
                out.add(text)
        loaded = self.load(key)
        if loaded is None:
            raise DataError(f"token cache: {self.tokens_path(key)} vanished right after it was written")
        return loaded

