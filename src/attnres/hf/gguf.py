"""GGUF input: transformers reads (and dequantises) a GGUF file; attnres converts the result."""

from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path

import torch

from attnres.hf.conversion_error import ConversionError


def _split(path: str | Path) -> tuple[str, str]:
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"GGUF file {path} does not exist")
    return str(path.parent), path.name


def read_gguf_config(path: str | Path) -> dict:
    """The Hugging Face config dict (model_type llama, qwen2, ...) described by a GGUF file's metadata."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    directory, name = _split(path)
    try:
        return AutoConfig.from_pretrained(directory, gguf_file=name).to_dict()
    # transformers' and gguf's readers (bad magic, version, header, a key twice), what they make of the
    # metadata (an architecture that is a number, not a string) and the config classes (a head count of 0,
    # a hidden size that is not a multiple of it, ...)
    except (ValueError, OSError, struct.error, TypeError, LookupError, ArithmeticError,
            StrictDataclassError) as error:
        raise ConversionError(f"cannot read GGUF file {path} ({error}); give a GGUF v2 or v3 file of a supported "
                              f"model, or its Hugging Face checkpoint directory") from None


def read_gguf_weights(path: str | Path, expected_weights: int = 0) -> dict[str, torch.Tensor]:
    """The dequantised fp32 state dict, under Hugging Face names (model.layers.0.self_attn.q_proj.weight, ...).

    expected_weights: how many weights the model its metadata describes has; a file whose tensors hold
    fewer is refused before transformers builds that model (it would fill the missing weights with
    random ones, at the size the metadata claims)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    directory, name = _split(path)
    listed = gguf_weight_count(path)
    if listed < expected_weights:
        raise ConversionError(f"GGUF file {path} holds {listed:,} weights in its tensors but its metadata describes a "
                              f"model of {expected_weights:,}; the file is incomplete: give the whole GGUF file")
    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its load report repeats what the one line below says
    try:  # a tensor whose size the metadata's shape cannot take fails in transformers' reshape or load
        model, loading = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                              output_loading_info=True, ignore_mismatched_sizes=True)
    except (ValueError, RuntimeError) as error:
        problem = " ".join(str(error).split())[:200]
        raise ConversionError(f"GGUF file {path}: a tensor does not fit the shape the metadata's model gives it "
                              f"({problem}); the file is damaged or not of this architecture") from None
    finally:
        transformers_logging.set_verbosity(previous)
    mismatched = [f"{key} {tuple(found)} where the model has {tuple(wanted)}"
                  for key, found, wanted in sorted(loading.get("mismatched_keys") or [])]
    if mismatched:  # transformers would have drawn these at random in the metadata's shapes
        raise ConversionError(f"GGUF file {path} holds {len(mismatched)} tensor(s) of another shape than its "
                              f"metadata's model: {', '.join(mismatched[:3])}{', ...' if len(mismatched) > 3 else ''} "
                              f"(in transformers' names); the file is damaged or not of this architecture")
    if loading["missing_keys"]:  # transformers filled them with random weights, at the metadata's sizes
        missing = sorted(loading["missing_keys"])
        raise ConversionError(f"GGUF file {path} lacks {len(missing)} of the tensors its metadata's model needs "
                              f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}, in transformers' "
                              f"names); the file is incomplete or not of this architecture")
    return dict(model.state_dict())


# GGUF metadata value types: the byte width of each fixed-size one; 8 is a string, 9 an array.
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


def gguf_weight_count(path: str | Path) -> int:
    """The number of weights the tensor table of GGUF file `path` lists (each tensor's dimensions
    multiplied, summed), walking the header with every count and length checked against the file's
    size first; ConversionError for a file that is not GGUF v2 or v3, is cut short, or lists more weights
    than its bytes can hold (every ggml type takes more than one bit a weight)."""
    _split(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 24:
            raise ConversionError(f"GGUF file {path} is {size} bytes, shorter than a GGUF header (24 bytes)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _GgufHeader(buffer, path).weight_count()


class _GgufHeader:
    """A cursor over a GGUF file's header that refuses to step past the end of the file."""

    def __init__(self, buffer, path) -> None:
        self.buffer, self.path, self.pos = buffer, path, 0

    def take(self, size: int) -> int:
        """Step over `size` bytes; the offset they start at."""
        if size > len(self.buffer) - self.pos:
            raise ConversionError(f"GGUF file {self.path} is truncated or corrupt: its header claims {size:,} bytes at "
                                  f"offset {self.pos:,} of a {len(self.buffer):,}-byte file")
        self.pos += size
        return self.pos - size

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack_from(fmt, self.buffer, self.take(struct.calcsize(fmt)))

    def count(self, what: str, minimum_bytes: int) -> int:
        """A u64 count of items of at least `minimum_bytes` each; refused when the rest of the file cannot hold them."""
        (number,) = self.unpack("<Q")
        if number * minimum_bytes > len(self.buffer) - self.pos:
            raise ConversionError(f"GGUF file {self.path} is truncated or corrupt: it claims {number:,} {what} at "
                                  f"offset {self.pos:,} of a {len(self.buffer):,}-byte file")
        return number

    def skip_value(self, kind: int) -> None:
        if kind in _VALUE_BYTES:
            self.take(_VALUE_BYTES[kind])
        elif kind == _STRING:
            self.take(self.count("string bytes", 1))
        elif kind == _ARRAY:
            (element,) = self.unpack("<I")
            if element in _VALUE_BYTES:
                self.take(self.count("array items", _VALUE_BYTES[element]) * _VALUE_BYTES[element])
            elif element == _STRING:
                for _ in range(self.count("strings", 8)):
                    self.take(self.count("string bytes", 1))
            else:
                raise ConversionError(f"GGUF file {self.path}: an array of metadata value type {element} at offset "
                                      f"{self.pos:,} (types 0-8 and 10-12 are GGUF's)")
        else:
            raise ConversionError(f"GGUF file {self.path}: metadata value type {kind} at offset {self.pos:,} "
                                  f"(types 0-12 are GGUF's)")

    def weight_count(self) -> int:
        magic, version = self.unpack("<4sI")
        if magic != b"GGUF" or version not in (2, 3):
            raise ConversionError(f"{self.path} is not a GGUF v2 or v3 file (magic {magic!r}, version {version})")
        (tensors,) = self.unpack("<Q")
        for _ in range(self.count("metadata entries", 8 + 4 + 1)):
            self.take(self.count("key bytes", 1))
            self.skip_value(*self.unpack("<I"))
        if tensors * (8 + 4 + 4 + 8) > len(self.buffer) - self.pos:
            raise ConversionError(f"GGUF file {self.path} is truncated or corrupt: it claims {tensors:,} tensors")
        weights = 0
        for _ in range(tensors):
            self.take(self.count("name bytes", 1))
            (dims,) = self.unpack("<I")
            if dims > _MAX_DIMS:
                raise ConversionError(f"GGUF file {self.path}: a tensor of {dims} dimensions (ggml has at most "
                                      f"{_MAX_DIMS})")
            weights += math.prod(self.unpack(f"<{dims}Q"))
            self.unpack("<IQ")  # ggml type, data offset
        if weights > 8 * len(self.buffer):
            raise ConversionError(f"GGUF file {self.path} is truncated or corrupt: its tensors list {weights:,} "
                                  f"weights, more than its {len(self.buffer):,} bytes can hold")
        return weights


def save_gguf_tokenizer(path: str | Path, out_dir: str | Path) -> None:
    """Save the tokenizer embedded in a GGUF file as a Hugging Face tokenizer directory; ConversionError
    for a file without one transformers can rebuild."""
    from transformers import AutoTokenizer

    directory, name = _split(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except (ValueError, KeyError) as error:  # transformers' refusal of the file's tokenizer metadata (or its absence)
        raise ConversionError(f"GGUF file {path} holds no tokenizer transformers can rebuild ({error}); give a GGUF "
                              f"file with its tokenizer, or the model's Hugging Face checkpoint directory") from None
    tokenizer.save_pretrained(str(out_dir))
