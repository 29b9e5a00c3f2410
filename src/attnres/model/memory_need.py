"""What a model needs in memory before any of it is allocated, and a refusal where that cannot fit.

One formula for every caller: `attnres train` (and so `compare` and `scaling`) checks a run's model
before building it, `attnres generate` checks its static cache before allocating it, and `attnres
bench` checks each variant and reports its step's peak with the same training-state count.

- Training keeps four fp32 copies of every parameter: the weights, their gradients and AdamW's two
  moments (`training_state_bytes`). Activations come on top, and depend on the batch; they are left
  out, so the estimate is a floor: a run refused by it could never have fitted.
- Decoding keeps the weights and a static cache at its capacity, whose size each layer's token mixer
  states (`TokenMixer.cache_bytes`): keys and values per position, a latent per position, or a
  fixed-size recurrent state.

The bound is the machine's total memory (attnres.common.machine.machine_memory_bytes), not what is
free at the moment, so a refusal never depends on what else runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnres.common.errors import InputError
from attnres.common.machine import machine_memory_bytes

FP32_BYTES = 4
FP32_COPIES = 4  # weights, gradients, AdamW's first and second moments, all fp32
GIB = 2 ** 30


def training_state_bytes(num_parameters: int) -> int:
    """Bytes of weights, gradients and AdamW's two moments of `num_parameters` fp32 parameters."""
    return FP32_COPIES * FP32_BYTES * num_parameters


def cache_bytes(model: nn.Module, batch: int, positions: int, dtype: torch.dtype) -> int:
    """Bytes a static cache of `model` (an AttnResLM, or one built on the meta device) holds for `batch`
    rows at a capacity of `positions`, keys and values in `dtype`; layers whose mixer does not state
    its size count 0."""
    return sum(layer.self_attn.cache_bytes(batch, positions, dtype) or 0 for layer in model.layers)


def gib(nbytes: int) -> str:
    """'12.3 GiB'."""
    return f"{nbytes / GIB:.1f} GiB"


def check_fits(need: int, what: str, device: torch.device, remedy: str | Callable[[int], str]) -> None:
    """InputError when `need` bytes exceed the memory of `device`'s machine: one line with `what`
    ("the model's weights ... need"), the estimate, the machine's memory and `remedy` (or
    `remedy(memory bytes)`, for advice that depends on it). Nothing is checked where the machine's
    memory cannot be read."""
    have = machine_memory_bytes(device)
    if have is not None and need > have:
        where = "this GPU" if device.type == "cuda" else "this machine"
        advice = remedy(have) if callable(remedy) else remedy
        raise InputError(f"{what} {gib(need)}, more than the {gib(have)} of memory {where} has; {advice}")


__all__ = ["FP32_BYTES", "FP32_COPIES", "cache_bytes", "check_fits", "gib", "training_state_bytes"]
