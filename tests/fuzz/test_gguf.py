"""Fuzzing the GGUF reader: magic, version, tensor and metadata counts, string lengths, value and
array types, the tensor table, and truncation, starting from a valid Llama header (GGUF v3, as
llama.cpp lays it out: little-endian counts and lengths, then the metadata, then the tensor table)."""

import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnres.common.errors import InputError
from attnres.hf.convert import convert_checkpoint, read_source_config
from attnres.hf.gguf import gguf_weight_count, read_gguf_config
from tests.fuzz.helpers import HUGE, check_reader, mostly, u32, u64, unchanged

pytest.importorskip("gguf")  # transformers' GGUF support needs it (and accelerate) installed

ERRORS = (InputError,)
STRING, ARRAY, UINT32, FLOAT32 = 8, 9, 4, 6
LLAMA = [("general.architecture", STRING, "llama"), ("llama.block_count", UINT32, 2),
         ("llama.context_length", UINT32, 64), ("llama.embedding_length", UINT32, 32),
         ("llama.feed_forward_length", UINT32, 48), ("llama.attention.head_count", UINT32, 4),
         ("llama.attention.head_count_kv", UINT32, 2), ("llama.rope.freq_base", FLOAT32, 10000.0),
         ("llama.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5), ("llama.vocab_size", UINT32, 64),
         ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.tokens", ARRAY, [f"t{i}" for i in range(4)])]
TENSORS = [("token_embd.weight", [32, 64], 0, 0), ("output_norm.weight", [32], 0, 8192)]  # F32, ggml order
DATA_BYTES = 4 * (32 * 64 + 32)
lengths = st.sampled_from([0, 1, 7, 2**31, 2**32, 2**63, 2**64 - 1, HUGE])
counts = st.one_of(st.integers(0, 40), lengths)


FIELD_ODDS = 15  # a field is changed in one draw of 16: most headers keep most fields


def string(text: bytes, length: int | None = None) -> bytes:
    return u64(len(text) if length is None else length) + text


@st.composite
def strings(draw, text: str) -> bytes:
    """A GGUF string (u64 length, UTF-8 bytes), its length or bytes sometimes wrong."""
    data = draw(mostly(text.encode(), st.one_of(st.binary(max_size=12), st.text(max_size=6).map(str.encode)),
                       FIELD_ODDS))
    return string(data, draw(mostly(None, st.one_of(lengths, st.integers(0, len(data) + 4)), FIELD_ODDS)))


@st.composite
def values(draw, kind: int, value) -> bytes:
    """A metadata value of GGUF type `kind`, or of another type, with its bytes or counts changed."""
    kind = draw(mostly(kind, st.one_of(st.integers(0, 13), st.sampled_from([2**31, 2**32 - 1])), FIELD_ODDS))
    if kind == STRING:
        return u32(kind) + draw(strings(value if isinstance(value, str) else "llama"))
    if kind == ARRAY:
        items = value if isinstance(value, list) else ["a", "b"]
        element = draw(mostly(STRING, st.integers(0, 13)))
        count = draw(mostly(len(items), counts))
        body = b"".join(draw(strings(item)) for item in items) if element == STRING else draw(st.binary(max_size=32))
        return u32(kind) + u32(element) + u64(count) + body
    if kind == UINT32:
        number = draw(mostly(value if isinstance(value, int) else 1, st.integers(0, 2**32 - 1), FIELD_ODDS))
        return u32(kind) + u32(number)
    if kind == FLOAT32:
        return u32(kind) + struct.pack("<f", draw(st.one_of(st.just(float(value) if isinstance(value, (int, float))
                                                                    else 1.0), st.floats(width=32))))
    return u32(kind) + draw(st.binary(max_size=9))


@st.composite
def gguf_files(draw) -> bytes:
    kept = draw(st.lists(st.sampled_from(range(len(LLAMA))), unique=True, min_size=len(LLAMA) - 2,
                         max_size=len(LLAMA)).map(sorted))
    entries = [draw(strings(LLAMA[i][0])) + draw(values(LLAMA[i][1], LLAMA[i][2])) for i in kept]
    tensors = []
    for name, dims, kind, offset in TENSORS:
        n_dims = draw(mostly(len(dims), st.one_of(st.integers(0, 5), st.sampled_from([2**31, 2**32 - 1]))))
        shape = draw(mostly(dims, st.lists(st.one_of(st.integers(0, 64), lengths), max_size=4)))
        tensors.append(draw(strings(name)) + u32(n_dims) + b"".join(map(u64, shape))
                       + u32(draw(mostly(kind, st.integers(0, 40)))) + u64(draw(mostly(offset, lengths))))
    head = (draw(mostly(b"GGUF", st.binary(min_size=4, max_size=4))) + u32(draw(mostly(
        3, st.sampled_from([0, 1, 2, 4, 2**32 - 1])))) + u64(draw(mostly(len(tensors), counts)))
        + u64(draw(mostly(len(entries), counts))))
    blob = head + b"".join(entries) + b"".join(tensors)
    blob += b"\0" * (-len(blob) % 32) + b"\1" * DATA_BYTES
    return draw(mostly(blob, st.integers(0, len(blob)).map(lambda end: blob[:end])))


@given(gguf_files())
def test_read_gguf_config(blob):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        path.write_bytes(blob)
        with unchanged(Path(tmp)):
            result = check_reader(lambda: read_gguf_config(path), ERRORS)
            assert isinstance(result, (dict, InputError))
            assert isinstance(check_reader(lambda: read_source_config(path), ERRORS), (dict, InputError))
            listed = check_reader(lambda: gguf_weight_count(path), ERRORS)
            assert isinstance(listed, (int, InputError)) and not (isinstance(listed, int) and listed > 8 * len(blob))


def test_huge_model_claimed_by_a_small_file_is_refused():
    """Metadata describing a model of ~3 x 10^11 parameters (10^12 bytes in fp32) in a file of a few
    hundred bytes (no tensor data): refused before anything of that size is allocated."""
    header = [("general.architecture", STRING, "llama"), ("llama.block_count", UINT32, 64),
              ("llama.context_length", UINT32, 64), ("llama.embedding_length", UINT32, 16384),
              ("llama.feed_forward_length", UINT32, 65536), ("llama.attention.head_count", UINT32, 128),
              ("llama.attention.head_count_kv", UINT32, 8), ("llama.vocab_size", UINT32, 32)]
    entries = b"".join(string(k.encode()) + u32(kind) + (string(v.encode()) if kind == STRING else u32(v))
                       for k, kind, v in header)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        path.write_bytes(b"GGUF" + u32(3) + u64(0) + u64(len(header)) + entries)
        with unchanged(Path(tmp)):
            assert isinstance(check_reader(lambda: convert_checkpoint(path), ERRORS), InputError)


ARCHITECTURE = string(b"general.architecture") + u32(STRING) + string(b"llama")


@pytest.mark.parametrize("entries", [
    [string(b"general.architecture") + u32(UINT32) + u32(1)],  # a number: a TypeError inside transformers
    [ARCHITECTURE, ARCHITECTURE],  # a key twice: a KeyError inside gguf's reader
], ids=["architecture-number", "duplicate-key"])
def test_metadata_found_by_the_long_run(entries):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        path.write_bytes(b"GGUF" + u32(3) + u64(0) + u64(len(entries)) + b"".join(entries))
        assert isinstance(check_reader(lambda: read_gguf_config(path), ERRORS), InputError)
