"""All weights or none: whether the tensors of a model directory are exactly the ones its model holds.

One check, `weights_misfit`, for every command that loads a Hugging Face-format attnres directory
(`attnres convert` output or a training checkpoint): `finetune` (init_from) and `analyze` run it on the
tensors they load (`attnres.train.starting_model.load_initial_weights`), `generate` and `lm-eval` on
the weight files' headers before transformers loads them (`attnres.hf.model_dir.check_model_dir`), since
transformers would fill a missing tensor with random values and say so only in its load report.

The rule: every tensor of the model's state dict is there, with its shape, and nothing else is. Two
exceptions, both exact: the routing parameters (`AttnResLM.routing_parameters`) may be absent, as in a
converted standard model, and then take the method's initialisation (zero queries: the source model's
function); and a tied model's `lm_head.weight` may be absent or present, being the embedding itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from attnres.model import AttnResLM

LISTED = 6  # tensor names shown per kind of misfit; the rest are counted
PREFIX = "model."  # `attnres convert` output's names (AttnResForCausalLM.model); training checkpoints have none


def weights_misfit(model: AttnResLM, shapes: Mapping[str, Sequence[int]]) -> tuple[str | None, list[str]]:
    """(what of `shapes`, {AttnResLM parameter name: shape}, does not fit `model`, in one line naming
    the missing, unexpected and mis-shaped tensors, or None when all fits; the routing parameters
    absent from `shapes`, which keep the model's initialisation). `model` may be on the meta device."""
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    given = {name: tuple(shape) for name, shape in shapes.items()}
    if model.config.tie_embeddings:  # the same tensor as embed_tokens.weight
        expected.pop("lm_head.weight", None)
        given.pop("lm_head.weight", None)
    routing = {name for name, _ in model.routing_parameters()}
    absent = [name for name in expected if name not in given]
    missing = [name for name in absent if name not in routing]
    unexpected = sorted(name for name in given if name not in expected)
    misshaped = [f"{name} {list(given[name])} (the model's: {list(expected[name])})"
                 for name in expected if name in given and given[name] != expected[name]]
    problems = [f"{kind} {_listing(names)}" for kind, names in
                (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)) if names]
    return ("; ".join(problems) if problems else None), [name for name in absent if name in routing]


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f", ... ({len(names) - LISTED} more)" if len(names) > LISTED else "")


def header_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """{AttnResLM name: shape} of every tensor in the safetensors `files`, read from their headers alone
    (`model.` prefixes removed). The files must open (SafetensorError / OSError otherwise)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for key in reader.keys():
                shapes[key.removeprefix(PREFIX)] = tuple(reader.get_slice(key).get_shape())
    return shapes


def pickle_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """{AttnResLM name: shape} of the tensors in pytorch_model.bin-style `files`, loaded on the meta
    device (no data read into memory); entries that are not tensors count as tensors of no shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        state = torch.load(file, map_location="meta", weights_only=True)
        for key, value in (state.items() if isinstance(state, dict) else ()):
            shapes[str(key).removeprefix(PREFIX)] = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
    return shapes
