"""What the decoder needs of its two sub-layers: the token mixer (`TokenMixer`, the even sub-layer,
which mixes positions) and the feed-forward (`FeedForward`, the odd one). The tables of built-in kinds
are `attnres.model.token_mixers` and `attnres.model.feed_forwards`.

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

A feed-forward, (B, T, D) -> (B, T, D), subclasses `FeedForward` and states its FLOPs per token
(active parameters only), initialises the parameters it holds directly, and may balance itself after
each optimizer step (a mixture of experts' score bias): `after_step`, called by the trainer on every
rank with a function that sums a tensor over the data-parallel ranks, reports the loads it counted
(in training, or everywhere after `count_loads(True)`: attnres.analysis.expert_load).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

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


class FeedForward(nn.Module):
    """Base class of feed-forwards; see the module docstring for the contract."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        raise NotImplementedError

    def flops_per_token(self) -> int:
        """Forward FLOPs per token, of the parameters a token goes through (a mixture of experts' k experts)."""
        raise NotImplementedError(f"{type(self).__name__} does not state its FLOPs (flops_per_token)")

    def reset_parameters(self, std: float) -> None:
        """Initialise the parameters held by the module itself, from N(0, std) where drawn (its nn.Linear
        sub-modules are reached one by one by attnres.model.init_weights.init_module)."""

    def count_loads(self, on: bool) -> None:
        """Count what `after_step` reports outside training too (on), or in training only (the default)."""

    def after_step(self, reduce: Callable[[torch.Tensor], torch.Tensor], rate: float) -> torch.Tensor | None:
        """After an optimizer step: the loads the step counted (a mixture of experts' assignments per
        expert, (E,)), summed over ranks by `reduce`, and the module moved towards balance by them at
        `rate` (0: counted and forgotten); None for a feed-forward with nothing to balance."""
        return None


__all__ = ["CACHE_STATES", "KV_STATE", "RECURRENT_STATE", "FeedForward", "TokenMixer"]
