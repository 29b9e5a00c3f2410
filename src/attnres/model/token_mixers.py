"""The token-mixing protocol and the table of layer types: what the decoder needs of the module that
mixes a layer's positions (attention), and which module each `ModelConfig.layer_types` name builds.

A decoder layer calls its token mixer the same way whatever it is:

    delta = mixer(x, rope, cache, layer_idx, mask, real)
    # x (B, T, D) -> (B, T, D); rope: (cos, sin) of the T new positions; cache: None or the model's
    # cache; mask: None (causal) or a boolean attention mask over cached + new positions; real: None
    # or (B, T) bool, the new positions that are real tokens (a padded batch)

and a mixer ignores what it does not need (latent attention encodes no position, Kimi Delta
Attention zeroes pads instead of masking). A token mixer subclasses `TokenMixer` and states:

- `cache_state`: what it keeps in a cache, `KV_STATE` (keys and values per position, written with
  `cache.update(a, b, layer_idx)`: the cache grows with the sequence, and its length is read from
  such a layer) or `RECURRENT_STATE` (a fixed-size state, `cache.linear_state(layer_idx)` /
  `cache.set_linear_state(...)`). Caches (attnres.model.cache) allocate each on a layer's first call.
- `flops_per_token(seq_len)`: forward FLOPs per token of its mixing over positions on sequences of
  seq_len tokens; its projections are nn.Linear modules, counted apart (attnres.model.flops).
- `decode_cache_bytes(cache, layer_idx)`: the bytes of `cache` one decode step of it reads
  (attnres.generation.memory_traffic).
- `cache_bytes(batch, positions, dtype)`: the bytes its cache would hold for `batch` rows at a
  capacity of `positions`, before any is allocated (attnres.model.memory_need); None where unknown.
- `not_compiled`: None where `attnres.generation.fast_generator` compiles its decode step; else what to call
  it in the message saying that step is not compiled yet.
- its initialisation: `attnres.model.init_weights.init_module` reaches each of its sub-modules (linear
  weights N(0, std), norm gains 1, ...) and calls the mixer's own `reset_parameters()` for the
  parameters it holds directly (none, for the built-in mixers); a sub-module with a rule of its own
  declares `own_init = True` and is reset by its `reset_parameters()` in module order.

`TOKEN_MIXERS` maps a layer type to its row (`TokenMixerType`): the name, the builder that makes
the module from the model's config and the layer's index, the cache state its mixers keep and the
config fields it needs. The builder decides what to build (the
"full_attention" row builds latent attention where `config.mla` is set). The built-in rows,
"full_attention" and "linear_attention", are registered beside the decoder layer
(attnres.model.layers); `register_token_mixer` adds one, and `ModelConfig.layer_types` accepts
every name in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from attnres.common.errors import InputError
from attnres.common.registry import Registry
from attnres.model.cache import KV_STATE, RECURRENT_STATE

CACHE_STATES = (KV_STATE, RECURRENT_STATE)


class TokenMixer(nn.Module):
    """Base class of token mixers; see the module docstring for the contract."""

    cache_state: ClassVar[str] = KV_STATE
    not_compiled: ClassVar[str | None] = None
    own_init: ClassVar[bool] = True  # init_module calls reset_parameters() (a no-op unless overridden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None, cache=None,
                layer_idx: int = 0, mask: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); the other arguments as in the module docstring."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """Initialise the parameters held by the mixer itself (its sub-modules are reached one by one)."""

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token of mixing over positions, on sequences of `seq_len` tokens."""
        raise NotImplementedError(f"{type(self).__name__} does not state its FLOPs (flops_per_token)")

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int | None:
        """Bytes of this layer's cache for `batch` rows at a capacity of `positions`, with keys and values
        in `dtype` (the layer's output dtype); None where the mixer does not state it."""
        return None

    def decode_cache_bytes(self, cache, layer_idx: int) -> int:
        """Bytes of an attnres cache (KVCache, StaticKVCache) read by one decode step of layer
        `layer_idx`: its key and value buffers whole (a static cache's masked attention reads every
        column), or its recurrent states once."""
        if self.cache_state == KV_STATE:
            held = [store[layer_idx] for store in (cache.keys, cache.values) if layer_idx in store]
        else:
            held = list(cache.linear.get(layer_idx, ()))
        return sum(t.numel() * t.element_size() for t in held)


@dataclass(frozen=True)
class TokenMixerType:
    """A row of the layer-type table.

    name:        the layer type, as `ModelConfig.layer_types` and a config.json spell it.
    build:       (config, layer index) -> the layer's TokenMixer. Its options come from the config's
                 fields (as `mla` and `kda` do) or from the row itself (e.g. a window size bound into
                 the builder).
    cache_state: the `cache_state` of the mixers it builds (checked when one is built), stated here
                 so that ModelConfig can check a layer pattern without building it: a model needs at
                 least one layer that caches keys and values, whose cache tells the sequence length.
    requires:    names of ModelConfig fields that must be set for this layer type (KDA needs `kda`).
    """

    name: str
    build: Callable[..., TokenMixer]
    cache_state: str = KV_STATE
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"TokenMixerType.name must be a non-empty string, got {self.name!r}")
        if not callable(self.build):
            raise InputError(f"TokenMixerType {self.name!r}: build must be callable, got {self.build!r}")
        if self.cache_state not in CACHE_STATES:
            raise InputError(f"TokenMixerType {self.name!r}: cache_state must be one of {list(CACHE_STATES)}, "
                             f"got {self.cache_state!r}")
        if not isinstance(self.requires, tuple) or not all(isinstance(f, str) for f in self.requires):
            raise InputError(f"TokenMixerType {self.name!r}: requires must be a tuple of field names, "
                             f"got {self.requires!r}")


TOKEN_MIXERS: Registry[TokenMixerType] = Registry("layer type")


def register_token_mixer(row: TokenMixerType) -> TokenMixerType:
    """Add `row` to the table (a name already there is an error); returns it."""
    return TOKEN_MIXERS.register(row)


def unregister_token_mixer(name: str) -> None:
    """Remove a layer type added with `register_token_mixer` (for tests and experiments)."""
    TOKEN_MIXERS.unregister(name)


def build_token_mixer(config, index: int) -> TokenMixer:
    """Layer `index`'s token mixer for `config` (a ModelConfig), by its layer type's row."""
    row = TOKEN_MIXERS[config.layer_type(index)]
    mixer = row.build(config, index)
    if not isinstance(mixer, TokenMixer) or mixer.cache_state != row.cache_state:
        raise InputError(f"layer type {row.name!r} built {type(mixer).__name__}, which is not a TokenMixer with "
                         f"the row's cache_state {row.cache_state!r}")
    return mixer


__all__ = ["CACHE_STATES", "KV_STATE", "RECURRENT_STATE", "TOKEN_MIXERS", "TokenMixer", "TokenMixerType",
           "build_token_mixer", "register_token_mixer", "unregister_token_mixer"]
