"""Packing documents into one EOS-separated stream and the on-disk token cache."""

from __future__ import annotations

import numpy as np
import pytest

from attnres.data import DataError, train_bpe
from attnres.data import packing
from attnres.data.packing import TokenCache, pack_documents, token_dtype
from tests.data.helpers import make_texts


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(make_texts(60, seed=2), 300)


def expected_stream(texts, tokenizer):
    return np.array([i for t in texts for i in tokenizer.encode(t) + [tokenizer.eos_id]], dtype=np.int64)


def test_each_document_is_followed_by_eos(tokenizer):
    texts = make_texts(5, seed=4)
    stream = np.concatenate(list(pack_documents(texts, tokenizer)))
    assert stream.dtype == np.uint16
    assert np.array_equal(stream.astype(np.int64), expected_stream(texts, tokenizer))
    assert len(stream) == sum(len(tokenizer.encode(t)) + 1 for t in texts)
    ends = np.flatnonzero(stream == tokenizer.eos_id)
    assert len(ends) == 5 and ends[-1] == len(stream) - 1
    assert tokenizer.decode(stream[: ends[0]]) == texts[0]


def test_dtype_follows_vocab_size():
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32 and token_dtype(151_000) == np.uint32


def test_chunked_writing_equals_one_shot(tokenizer, tmp_path, monkeypatch):
    texts = make_texts(23, seed=6)
    monkeypatch.setattr(packing, "CHUNK_DOCUMENTS", 4)
    assert len(list(pack_documents(texts, tokenizer))) == 6
    tokens, meta = TokenCache(tmp_path).load_or_build("k", lambda: texts, tokenizer)
    assert np.array_equal(np.asarray(tokens, dtype=np.int64), expected_stream(texts, tokenizer))
    assert (meta["documents"], meta["length"], meta["dtype"], meta["key"]) == (23, len(tokens), "uint16", "k")


def test_cache_is_a_memmap_reused_without_tokenising(tokenizer, tmp_path, monkeypatch):
    texts = make_texts(10, seed=7)
    cache = TokenCache(tmp_path)
    first, _ = cache.load_or_build("key", lambda: texts, tokenizer)
    assert isinstance(first, np.memmap) and not first.flags.writeable

    def no_texts():
        raise AssertionError("re-read the documents")

    monkeypatch.setattr(type(tokenizer), "encode_batch", lambda self, t: pytest.fail("re-tokenised"))
    again, meta = cache.load_or_build("key", no_texts, tokenizer)
    assert np.array_equal(again, first) and meta["documents"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.bin", "key.json"]


def test_truncated_cache_is_ignored(tokenizer, tmp_path):
    cache = TokenCache(tmp_path)
    cache.load_or_build("key", lambda: ["some text"], tokenizer)
    with cache.tokens_path("key").open("r+b") as f:
        f.truncate(2)
    assert cache.load("key") is None
    tokens, _ = cache.load_or_build("key", lambda: ["some text"], tokenizer)
    assert np.array_equal(np.asarray(tokens, dtype=np.int64), expected_stream(["some text"], tokenizer))


def test_failed_build_leaves_nothing(tokenizer, tmp_path):
    def broken():
        yield "one document"
        raise DataError("source broke halfway")

    cache = TokenCache(tmp_path)
    with pytest.raises(DataError, match="halfway"):
        cache.load_or_build("key", broken, tokenizer)
    assert list(tmp_path.iterdir()) == [] and cache.load("key") is None


def test_the_digest_is_of_the_streams_bytes_written_in_chunks_or_computed_for_an_old_cache(tokenizer, tmp_path,
                                                                                            monkeypatch):
    import hashlib
    import json
    texts = make_texts(23, seed=6)
    monkeypatch.setattr(packing, "CHUNK_DOCUMENTS", 4)
    cache = TokenCache(tmp_path)
    tokens, meta = cache.load_or_build("k", lambda: texts, tokenizer)
    expected = hashlib.blake2b(expected_stream(texts, tokenizer).astype(np.uint16).tobytes(), digest_size=16)
    assert meta["digest"] == packing.stream_digest(tokens, meta) == expected.hexdigest()
    del meta["digest"]  # a stream cached before digests were recorded
    cache.meta_path("k").write_text(json.dumps(meta))
    assert packing.stream_digest(*cache.load("k")) == expected.hexdigest()
    _, other = TokenCache(tmp_path / "other").load_or_build("k", lambda: texts[:-1], tokenizer)
    assert other["digest"] != expected.hexdigest()


def test_a_writer_killed_mid_stream_leaves_a_file_the_next_writer_removes(tokenizer, tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    # a writer that tokenises one chunk, then waits: killed there, it leaves its temporary file
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from attnres.data import packing, train_bpe\n"
        "from tests.data.helpers import make_texts\n"
        "packing.CHUNK_DOCUMENTS = 1\n"
        "def texts():\n"
        "    yield 'one document'\n"
        "    yield 'two documents'\n"
        "    print('written', flush=True)\n"
        "    time.sleep(600)\n"
        f"packing.TokenCache({str(tmp_path)!r}).load_or_build('key', texts, train_bpe(make_texts(60, seed=2), 300))\n")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    assert child.stdout.readline().strip() == "written"
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(f".key-{socket.gethostname()}-{child.pid}-")
    other_host = tmp_path / ".key-another-host-1-abc.tmp"  # a writer on another machine sharing the cache: kept
    other_host.write_bytes(b"")
    TokenCache(tmp_path).load_or_build("key", lambda: ["a document"], tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == [other_host.name, "key.bin", "key.json"]
