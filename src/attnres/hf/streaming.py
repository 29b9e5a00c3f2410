"""Checkpoint conversion in bounded memory: `attnres convert` of a safetensors checkpoint directory.

`stream_to_hf` writes what `convert_to_hf` writes (the same tensors bit for bit, config.json,
generation_config.json, the tokenizer files) without holding the model or the checkpoint. Before any
weight is read it checks the config (`model_config_from_hf`), then runs the in-memory reader and
mapping (`convert._read_weights`, `convert_state_dict`) on meta tensors made from the safetensors
headers alone: the same refusals, shard index and Kimi Linear's expert stacking and convolution
joins included. The output's layout is then fixed (names, dtypes, shapes, shards of at most
`max_shard_size` bytes split as transformers splits them, byte offsets), and each source shard is
opened in turn with safetensors' lazy reader and its tensors copied, a slice of at most `CHUNK_BYTES`
at a time, cast to the requested dtype and written straight to their place in the output files. A
run-time tensor made of several checkpoint tensors (Kimi's stacked experts, joined convolutions) is
their bytes in order, so each part is written where it belongs and no group is ever gathered in
memory. Peak memory: the source shard being read (mapped while it is open) plus a constant.

The routing parameters, absent from any source checkpoint, take their initialisation (zero queries,
unit key gains, zero gates, ...) on the depth mixers alone, built in the requested dtype as
`convert_checkpoint` builds them, so they are bit-identical to its. mHC draws its projections from
torch's global generator; since the rest of the model is never initialised here, those draws differ
from the in-memory path's (mHC does not convert function-preservingly either way).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from attnres.checkpoint.hf_dir import read_generation_config, special_token_ids
from attnres.data.tiktoken_files import check_tiktoken_source
from attnres.hf import export
from attnres.hf.convert import (SAFETENSORS_FILES, _read_safetensors, _read_weights, check_tied_head,
                                convert_state_dict, model_config_from_hf, read_source_config)
from attnres.hf.conversion_error import ConversionError
from attnres.hf.kimi_linear import MODEL_TYPE as KIMI_LINEAR
from attnres.hf.kimi_linear import Parts, runtime_layout
from attnres.model import AttnResLM, ModelConfig
from attnres.model.init_weights import init_module

SINGLE_FILE, INDEX_FILE = SAFETENSORS_FILES
DEFAULT_MAX_SHARD_SIZE = "5GB"  # the Hub's customary shard size; memory does not depend on it
CHUNK_BYTES = 16 * 2**20  # the most bytes of one tensor read (and cast) at once
_SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}  # as transformers reads "5GB"

# safetensors' dtype names; a file's tensors lie in the order safetensors itself writes them: by
# dtype, widest first (its enum order, reversed), then by name.
_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
                torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint64: "U64",
                torch.uint32: "U32", torch.uint16: "U16", torch.uint8: "U8", torch.bool: "BOOL"}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_WRITE_ORDER = ["U64", "I64", "F64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E4M3", "F8_E5M2", "I8",
                "U8", "BOOL"]


@dataclass(frozen=True)
class Converted:
    """What a conversion wrote: the output directory, the model's config, its parameter count (tied
    weights once) and whether it was streamed (False: converted in memory)."""

    out: Path
    config: ModelConfig
    num_parameters: int
    streamed: bool


@dataclass
class _Tensor:
    """One output tensor: its name in the file (`model.<AttnResLM name>`), dtype and shape, and either
    the checkpoint tensors whose bytes, in order, make it (`parts`) or its value (routing)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    parts: tuple[str, ...] = ()
    value: torch.Tensor | None = None
    file: int = 0  # index of its output shard
    offset: int = 0  # byte offset of its data in that file

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class _Plan:
    model: AttnResLM  # on the meta device, but for its routing parameters
    tensors: list[_Tensor]  # in state-dict order
    sources: dict[str, Path]  # checkpoint name -> the file holding it
    source_shapes: dict[str, tuple[int, ...]]
    num_parameters: int


def streamable(source) -> bool:
    """True for a checkpoint directory that `stream_to_hf` streams: one with model.safetensors, or shards
    named by model.safetensors.index.json."""
    path = Path(source)
    return path.is_dir() and any((path / name).is_file() for name in SAFETENSORS_FILES)


def stream_to_hf(source: str | Path, out_dir: str | Path, residual: str = "standard", residual_options=None,
                 dtype: torch.dtype = torch.float32, max_seq_len: int | None = None,
                 max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Converted:
    """`convert_to_hf` in bounded memory for a safetensors checkpoint directory (module doc); a GGUF
    file (transformers reads it whole) or a pytorch_model.bin checkpoint (a pickle is not read a tensor
    at a time) converts in memory through `convert_to_hf`.

    max_shard_size: the most bytes of one output file (an int, or "5GB", "500MB", ...); a larger model
    is split into model-0000i-of-0000n.safetensors with model.safetensors.index.json, as transformers
    splits it; one tensor larger than that sits alone in its file. The output directory appears
    whole or not at all (`build_hf_dir`). Returns what was written (`Converted`).
    """
    size_limit = _parse_size(max_shard_size)
    if not streamable(source):
        out, model = export.convert_to_hf(source, out_dir, residual=residual, residual_options=residual_options,
                                          dtype=dtype, max_seq_len=max_seq_len)
        return Converted(out, model.config, sum(p.numel() for p in model.parameters()), streamed=False)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConversionError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if sys.byteorder != "little":  # safetensors files are little-endian; tensors' bytes are written as they lie
        raise ConversionError("streaming conversion writes tensors' bytes as they are in memory; it needs a "
                              "little-endian machine")
    export.check_new_dir(out_dir)  # as convert_to_hf: before anything is read
    check_tiktoken_source(source)
    source_config = read_source_config(source)
    config = model_config_from_hf(source_config, residual=residual, residual_options=residual_options,
                                  max_seq_len=max_seq_len)  # config refusals before any weight is read
    plan = _plan(source, source_config, config, dtype)
    ids, generation = special_token_ids(source_config), read_generation_config(source)

    def write(tmp: Path) -> None:
        _write_config(tmp, plan.model, ids, generation)
        _write_weights(tmp, plan, size_limit)

    out = export.build_hf_dir(out_dir, write, tokenizer_dir=source)
    return Converted(out, config, plan.num_parameters, streamed=True)


# ----------------------------------------------------------------------------------------------
# Planning: names, shapes and places, from the headers alone


def _plan(source: str | Path, hf_config: dict, config: ModelConfig, dtype: torch.dtype) -> _Plan:
    """Check the checkpoint against `config` from its headers (and a tied head's values) and lay out the
    output (module doc)."""
    sources: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    def headers(file: Path) -> dict[str, torch.Tensor]:
        stand_ins = _header_stand_ins(file)
        sources.update(dict.fromkeys(stand_ins, file))
        shapes.update({name: tuple(t.shape) for name, t in stand_ins.items()})
        return stand_ins

    # The in-memory reader and its checks (shard index, Kimi's sets), on meta tensors: nothing is read.
    runtime = _read_weights(source, hf_config, headers)
    kimi = hf_config.get("model_type") == KIMI_LINEAR
    layout = runtime_layout(sources) if kimi else {name: Parts((name,)) for name in sources}
    # A tied head is compared with the embedding on its values, read below, before writing.
    heads = [name for name in runtime if name.removeprefix("model.") == "lm_head.weight"]
    head = heads[0] if config.tie_embeddings and len(heads) == 1 else None
    if head is not None:
        del runtime[head]
    mapped = convert_state_dict(runtime, config)  # every name and shape check; tensors are the stand-ins
    runtime_name = {id(tensor): name for name, tensor in runtime.items()}
    parts_of = {name: layout[runtime_name[id(tensor)]].names for name, tensor in mapped.items()}
    if head is not None:
        pair = layout[head].names[0], parts_of["embed_tokens.weight"][0]
        check_tied_head(*(_read_tensor(sources[key], key) for key in pair))

    # The model as convert_checkpoint builds it (in `dtype`), weightless: the output's names and dtypes.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = AttnResLM(config)
        routing = _routing_values(model)
    finally:
        torch.set_default_dtype(previous)
    tensors = []
    for name, tensor in model.state_dict().items():
        if config.tie_embeddings and name == "lm_head.weight":
            continue  # transformers saves a tied head once, as the embedding
        tensors.append(_Tensor(f"model.{name}", tensor.dtype, tuple(tensor.shape),
                               parts=parts_of.get(name, ()), value=routing.get(name)))
    count = sum(p.numel() for p in model.parameters())
    return _Plan(model, tensors, sources, shapes, count)


def _header_stand_ins(file: Path) -> dict[str, torch.Tensor]:
    """{name: a meta tensor of its shape and dtype} of one safetensors file, from its header alone."""
    def entries() -> dict[str, tuple[list[int], str]]:
        with safe_open(str(file), framework="pt") as handle:
            return {name: (handle.get_slice(name).get_shape(), handle.get_slice(name).get_dtype())
                    for name in handle.keys()}

    stand_ins = {}
    for name, (shape, dtype_name) in _read_safetensors(file, entries).items():
        if dtype_name not in _TORCH_DTYPES:
            raise ConversionError(f"{file}: tensor {name!r} has dtype {dtype_name}, which attnres does not convert")
        if dtype_name.startswith("F8") and len(shape) >= 2:
            raise ConversionError(f"{file}: tensor {name!r} has dtype {dtype_name}, a quantised (fp8) weight; attnres "
                                  f"converts unquantised weights (fp32, bf16, fp16): dequantise the checkpoint first")
        stand_ins[name] = torch.empty(shape, dtype=_TORCH_DTYPES[dtype_name], device="meta")
    return stand_ins


def _routing_values(model: AttnResLM) -> dict[str, torch.Tensor]:
    """{state-dict name: value} of the routing state of a meta `model`, initialised as `AttnResLM`
    initialises it (`init_module` on each depth mixer), in the current default dtype: only the mixers
    are ever allocated."""
    residual = model.residual.to_empty(device="cpu")
    for module in residual.modules():
        init_module(module, model.config.init_std)
    return {f"residual.{name}": tensor.detach() for name, tensor in residual.state_dict().items()}


def _parse_size(size: int | str) -> int:
    """Bytes of a max_shard_size: an int, or digits and a unit as transformers reads them ("5GB" = 5e9)."""
    value = None
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str) and size.strip()[-2:].upper() in _SIZE_UNITS:
        try:
            value = int(float(size.strip()[:-2]) * _SIZE_UNITS[size.strip()[-2:].upper()])
        except ValueError:
            pass
    if value is None or value <= 0:
        raise ConversionError(f"max_shard_size must be a positive number of bytes or a size like '5GB' or "
                              f"'500MB', got {size!r}")
    return value


# ----------------------------------------------------------------------------------------------
# Writing


def _write_config(tmp: Path, model: AttnResLM, token_ids: dict, generation: dict | None) -> None:
    """config.json and generation_config.json as `save_hf` writes them for `model` (on the meta device)."""
    with torch.device("meta"):  # the wrapper builds a model of its own before taking `model`: weightless
        wrapper = export.to_hf_model(model, token_ids, generation)
    # What save_pretrained records besides the weights (transformers 5): the dtype and the class.
    wrapper.config.dtype = str(wrapper.dtype).split(".")[1]
    wrapper.config.architectures = [type(wrapper).__name__]
    wrapper.config.save_pretrained(tmp)
    wrapper.generation_config.save_pretrained(tmp)


def _split(tensors: list[_Tensor], limit: int) -> list[list[_Tensor]]:
    """Output shards as huggingface_hub splits a state dict for transformers: in order, a new shard when
    the next tensor would pass `limit`, a tensor larger than `limit` alone."""
    shards: list[list[_Tensor]] = []
    current: list[_Tensor] = []
    size = 0
    for tensor in tensors:
        if tensor.nbytes > limit:
            shards.append([tensor])
            continue
        if size + tensor.nbytes > limit and current:
            shards.append(current)
            current, size = [], 0
        current.append(tensor)
        size += tensor.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def _header(shard: list[_Tensor], file: int) -> tuple[bytes, int]:
    """(the 8-byte length and JSON header of output file `file`, holding `shard`, its data's size), setting
    each tensor's `file` and its `offset`, where its data starts in the file. The header is what
    safetensors writes: metadata first, tensors in their data's order, padded with spaces to 8 bytes."""
    ordered = sorted(shard, key=lambda t: (_WRITE_ORDER.index(_DTYPE_NAMES[t.dtype]), t.name))
    header: dict = {"__metadata__": {"format": "pt"}}
    begin = 0
    for tensor in ordered:
        header[tensor.name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                               "data_offsets": [begin, begin + tensor.nbytes]}
        tensor.file, tensor.offset = file, begin
        begin += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    for tensor in ordered:
        tensor.offset += 8 + len(text)
    return len(text).to_bytes(8, "little") + text, begin


def _write_weights(tmp: Path, plan: _Plan, limit: int) -> None:
    """The output safetensors files (and their index when there are several), each tensor written at
    its place as its source shard is read (module doc)."""
    unknown = sorted({str(t.dtype) for t in plan.tensors if t.dtype not in _DTYPE_NAMES})
    if unknown:
        raise ConversionError(f"cannot write tensors of dtype {', '.join(unknown)} to safetensors")
    shards = _split(plan.tensors, limit)
    names = ([SINGLE_FILE] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    fds, expected = [], []
    try:
        for index, (name, shard) in enumerate(zip(names, shards, strict=True)):
            header, size = _header(shard, index)
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            _pwrite(fd, memoryview(header), 0)
            os.ftruncate(fd, len(header) + size)  # every byte is written below; checked at the end
            expected.append(size)
        written = [0] * len(shards)
        jobs: dict[Path, list[tuple[str, _Tensor, int]]] = {}  # source file -> (name, target, byte offset)
        for tensor in plan.tensors:
            if tensor.value is not None:
                written[tensor.file] += _write_tensor(fds[tensor.file], tensor.value.to(tensor.dtype), tensor.offset)
                continue
            offset = tensor.offset
            for key in tensor.parts:
                jobs.setdefault(plan.sources[key], []).append((key, tensor, offset))
                offset += math.prod(plan.source_shapes[key]) * tensor.dtype.itemsize
        for source in sorted(jobs):
            for file, count in _copy_shard(source, jobs[source], fds).items():
                written[file] += count
        if written != expected:  # a part unwritten would read as zeros: never publish that
            raise RuntimeError(f"internal error: wrote {written} bytes of tensor data where {expected} were due")
    finally:
        for fd in fds:
            os.close(fd)
    if len(shards) > 1:
        index = {"metadata": {"total_parameters": plan.num_parameters, "total_size": sum(expected)},
                 "weight_map": {t.name: names[t.file] for t in plan.tensors}}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _copy_shard(source: Path, jobs: list[tuple[str, _Tensor, int]], fds: list[int]) -> dict[int, int]:
    """Copy each listed tensor of one source file to its place, at most CHUNK_BYTES at a time, cast to
    its target's dtype; returns the bytes written per output file. The file is open (mapped) only here."""
    written: dict[int, int] = {}
    with _read_safetensors(f"the header from {source}", safe_open, str(source), "pt") as handle:
        for key, target, offset in jobs:
            view = handle.get_slice(key)
            shape = view.get_shape()
            if not shape:
                chunks = [None]  # a 0-d tensor, read whole
            else:
                row = math.prod(shape[1:]) * max(target.dtype.itemsize, _TORCH_DTYPES[view.get_dtype()].itemsize)
                step = max(1, CHUNK_BYTES // max(1, row))
                chunks = [slice(a, min(a + step, shape[0])) for a in range(0, shape[0], step)]
            for chunk in chunks:
                read = (handle.get_tensor, key) if chunk is None else (view.__getitem__, chunk)
                part = _read_safetensors(f"{key} from {source}", *read)
                if part.is_floating_point() and not bool(torch.isfinite(part).all()):
                    raise ConversionError(f"{source}: tensor {key} holds NaN or infinite values; the source "
                                          f"checkpoint is damaged")
                count = _write_tensor(fds[target.file], part.to(target.dtype), offset)
                offset += count
                written[target.file] = written.get(target.file, 0) + count
                del part
    return written


def _read_tensor(source: Path, key: str) -> torch.Tensor:
    with _read_safetensors(f"the header from {source}", safe_open, str(source), "pt") as handle:
        return _read_safetensors(f"{key} from {source}", handle.get_tensor, key)


def _write_tensor(fd: int, tensor: torch.Tensor, offset: int) -> int:
    """Write `tensor`'s bytes (contiguous, native order) at `offset` of file `fd`; returns their count."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    _pwrite(fd, memoryview(data), offset)
    return data.nbytes


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):  # one call writes at most about 2 GiB on Linux
        done += os.pwrite(fd, data[done:], offset + done)
