"""The contract every reader is fuzzed against, and the strategies that build its inputs.

A reader given any input either returns or raises one of the project's own error types with a
message (`check_reader`); any other exception fails the test, and so does running longer than
`TIME_LIMIT_S` (a hang, or work sized by an unchecked number in the input) or changing the folder it
reads from (`unchanged`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
from pathlib import Path

import yaml
from hypothesis import strategies as st

TIME_LIMIT_S = 20.0  # far above any reader's time on a sane input; the machine may be shared
HUGE = 10**12  # "a header claiming 10^12 bytes"


class Hang(BaseException):
    """A reader ran past TIME_LIMIT_S (a BaseException, so no `except Exception` in a reader hides it)."""


@contextlib.contextmanager
def bounded(seconds: float = TIME_LIMIT_S):
    """Raise Hang in the block when it runs longer than `seconds` (SIGALRM: the main thread only)."""
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_reader(call, errors: tuple[type[BaseException], ...]):
    """call() -> its result, or the refusal it raised when that is one of `errors` with a message.
    Anything else propagates and fails the test."""
    with bounded():
        try:
            return call()
        except errors as error:
            assert str(error).strip(), f"{type(error).__name__} without a message"
            return error


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of everything under `root`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            stat = path.lstat()
            out[path.relative_to(root).as_posix()] = (stat.st_size if name in filenames else 0, stat.st_mtime_ns)
    return out


@contextlib.contextmanager
def unchanged(root: Path):
    """Fail unless `root`'s contents (names, sizes, modification times) are the same after the block."""
    before = snapshot(root)
    yield
    after = snapshot(root)
    assert after == before, f"the reader wrote under {root}: {sorted(set(after.items()) ^ set(before.items()))}"


# ------------------------------------------------------------------------------------------------
# Values: what a YAML or JSON file can hold, with the numbers and words configs are made of.

WORDS = ("standard", "block_attnres", "full_attnres", "delta_block", "delta_attnres", "mhc", "hyper_connections",
         "denseformer", "auto", "reference", "fused", "bf16", "fp32", "fp16", "cosine", "wsd", "ddp", "fsdp",
         "pipeline", "none", "demo", "bpe", "1e-3", "3.0e-4", "true", "null", "attnres", "llama", "qwen2",
         "softmax", "sigmoid", "gate", "partial", "full_attention", "latent_attention", "linear_attention", "normal",
         "zero", "")

numbers = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.integers(),
    st.sampled_from([0, 1, 2, 4, 8, -1, 2**31, 2**63, 2**64, HUGE, 10**18, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)
texts = st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_keys = st.one_of(st.sampled_from(WORDS), st.text(max_size=10))
yaml_keys = st.one_of(json_keys, st.integers(min_value=-5, max_value=5), st.booleans(), st.none(), st.floats())


def nested(leaves, keys, max_leaves: int = 12):
    """Any nesting of lists and mappings over `leaves`."""
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                        max_leaves=max_leaves)


json_values = nested(scalars, json_keys)
yaml_values = nested(scalars, yaml_keys)


def mostly(value, other, odds: int = 4):
    """`value` in about `odds` draws of `odds` + 1, else a draw of `other` (shrinks to `value`)."""
    return st.integers(0, odds).flatmap(lambda i: other if i == odds else st.just(value))


@st.composite
def mutated(draw, base, values=yaml_values, keys=yaml_keys, odds: int = 3):
    """`base` (a valid config or record) with keys dropped, added or given other values, at any depth;
    each key is kept as it is in about `odds` draws of `odds` + 1. Shrinks towards `base` itself."""
    if isinstance(base, dict):
        out = {}
        for key, value in base.items():
            action = draw(mostly("keep", st.sampled_from(("recurse", "drop", "replace")), odds))
            if action == "keep":
                out[key] = value
            elif action == "recurse":
                out[key] = draw(mutated(value, values, keys, odds))
            elif action == "replace":
                out[key] = draw(values)
        out.update(draw(st.dictionaries(keys, values, max_size=2)))
        return out
    if isinstance(base, list):
        items = [draw(mutated(item, values, keys, odds)) for item in base]
        kept = items[:draw(st.integers(0, len(items)))] if draw(st.booleans()) else items
        return kept + draw(st.lists(values, max_size=2))
    return draw(st.one_of(st.just(base), values))


def yaml_text(value) -> str:
    """YAML for `value` (PyYAML's safe dumper; unicode as is)."""
    return yaml.safe_dump(value, allow_unicode=True, sort_keys=False)


def json_text(value) -> str:
    return json.dumps(value, allow_nan=True)


# Texts that are not what a reader expects: broken syntax, deep nesting, huge numbers, bad encodings.
garbage_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"\xff\xfe\x00", b"{", b"[" * 700 + b"]" * 700, b"1" * 5000, b"- " * 3000 + b"x",
                     b"\x00" * 16, "é".encode("latin-1"), b"a: b: c", b"? [a, b]\n: c", b"!!python/object:os.system x",
                     b"&a [*a]", b"{\"a\": NaN}", b"\"" + b"\\ud800" + b"\""]),
    st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
# JSON's parser nests deeper than YAML's before it gives up.
json_garbage = st.one_of(garbage_bytes, st.sampled_from([b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000]))


def alias_bomb(levels: int = 9, width: int = 10) -> str:
    """YAML whose aliases expand to width**levels leaves (a 'billion laughs' document)."""
    lines = []
    for level in range(levels):
        items = ["x"] * width if level == 0 else [f"*a{level - 1}"] * width
        lines.append(f"a{level}: &a{level} [{', '.join(items)}]")
    return "\n".join(lines) + "\n"


def u64(value: int) -> bytes:
    return struct.pack("<Q", value % 2**64)


def u32(value: int) -> bytes:
    return struct.pack("<I", value % 2**32)
