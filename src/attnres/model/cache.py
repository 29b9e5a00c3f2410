"""KVCache: keys and values of earlier positions, per layer, for incremental decoding.

Routing needs no cache of its own: it mixes depth sources per token, so only attention looks
across positions. The interface (`update(k, v, layer_idx)`, `get_seq_length()`) is the one Hugging
Face's Cache classes have, so either can be passed to AttnResLM. A padded batch's pads are cached
like any other position; the attention mask, which covers cached positions too, keeps real tokens
from reading them.

Storage is preallocated: each layer holds (B, H_kv, capacity, hd) buffers that new positions are
copied into in place, and attention reads a view of the filled part. Nothing is concatenated per
step and no length is read back from a device. Without `max_len` the capacity starts at the first
call's length rounded up to a power of two (at least 64) and doubles when full, so a long
generation reallocates O(log T) times; with `max_len` (e.g. prompt + new tokens, as gpt-fast sizes
its cache) it is allocated once.

Kimi Linear's layers cache other things through the same object: a latent-attention layer (MLA)
stores its latent and shared key as its "k" and "v" (any (B, H, T, d) pair is held), and a Kimi
Delta Attention layer its convolution window and recurrent state (`linear_state` /
`set_linear_state`), which do not grow with the sequence. Layers are held by index, so a layer
that caches nothing leaves no gap; the sequence length is that of the attention layers. Which of
the two a layer keeps is its token mixer's `cache_state` (attnres.model.token_mixers): `KV_STATE` or
`RECURRENT_STATE`; either is allocated on the layer's first call.

`StaticKVCache` is the fixed-shape cache of compiled decoding (`attnres.generation.fast_generator`): its
buffers are allocated once at `max_len`, zero-filled, and a compiled step writes one position at a
column given as a tensor and attends over the whole buffer with a mask of the filled positions, so
no shape changes from one token to the next.
"""

from __future__ import annotations

import torch

from attnres.common.checks import check_int
from attnres.common.errors import InputError

MIN_CAPACITY = 64
# What a token mixer keeps in a cache (`TokenMixer.cache_state`): keys and values per position
# (`update`), or a fixed-size convolution window and recurrent state (`linear_state`).
KV_STATE = "kv"
RECURRENT_STATE = "recurrent"


class KVCache:
    """Per-layer key/value buffers (B, H_kv, capacity, hd), by layer index; `lengths[i]` positions of
    layer i are filled. `linear[i]`: a linear-attention layer's (conv_state, recurrent_state)."""

    def __init__(self, max_len: int | None = None) -> None:
        check_int(max_len, "KVCache max_len", allow_none=True)
        self.max_len = max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lengths: dict[int, int] = {}
        self.linear: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *unused, **ignored) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' k, v (B, H_kv, T_new, hd) after the cached ones; return views of all
        positions' k, v (B, H_kv, T_cached + T_new, hd)."""
        if layer_idx not in self.keys:  # the layer's first call: nothing held yet
            self.keys[layer_idx] = k.new_empty(k.shape[0], k.shape[1], 0, k.shape[3])
            self.values[layer_idx] = v.new_empty(v.shape[0], v.shape[1], 0, v.shape[3])
            self.lengths[layer_idx] = 0
        start, stop = self.lengths[layer_idx], self.lengths[layer_idx] + k.shape[2]
        if stop > self.keys[layer_idx].shape[2]:
            self._grow(layer_idx, k, v, stop)
        self.keys[layer_idx][:, :, start:stop].copy_(k)
        self.values[layer_idx][:, :, start:stop].copy_(v)
        self.lengths[layer_idx] = stop
        return self.keys[layer_idx][:, :, :stop], self.values[layer_idx][:, :, :stop]

    def get_seq_length(self, layer_idx: int | None = None) -> int:
        """Number of cached positions (of layer `layer_idx`; None: of the first attention layer)."""
        if layer_idx is None:
            return next(iter(self.lengths.values()), 0)
        return self.lengths.get(layer_idx, 0)

    def linear_state(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A linear-attention layer's (conv_state, recurrent_state), or None before its first call."""
        return self.linear.get(layer_idx)

    def set_linear_state(self, layer_idx: int, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        """Hold a linear-attention layer's states after its latest call (in place where already held,
        so their addresses stay fixed)."""
        held = self.linear.get(layer_idx)
        if held is None or held[0].shape != conv_state.shape or held[1].shape != recurrent_state.shape:
            self.linear[layer_idx] = (conv_state.clone(), recurrent_state.clone())
        else:
            held[0].copy_(conv_state)
            held[1].copy_(recurrent_state)

    def _grow(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        """Reallocate layer `layer_idx`'s buffers to hold at least `needed` positions, keeping the filled part."""
        if self.max_len is not None:
            if needed > self.max_len:
                raise InputError(f"KVCache holds at most max_len={self.max_len} positions, {needed} were asked for")
            capacity = self.max_len
        else:
            capacity = max(MIN_CAPACITY, 1 << (needed - 1).bit_length())
        filled = self.lengths[layer_idx]
        for store, new in ((self.keys, k), (self.values, v)):
            buffer = self._allocate(new, capacity)
            if filled:
                buffer[:, :, :filled].copy_(store[layer_idx][:, :, :filled])
            store[layer_idx] = buffer

    def _allocate(self, like: torch.Tensor, capacity: int) -> torch.Tensor:
        """A new (B, H_kv, capacity, hd) buffer of `like`'s dtype and device (contents undefined)."""
        return like.new_empty(like.shape[0], like.shape[1], capacity, like.shape[3])


class StaticKVCache(KVCache):
    """A KVCache of fixed capacity `max_len`: zero-filled (B, H_kv, max_len, hd) buffers, never reallocated.

    `update` (the KVCache interface) appends after the filled part and returns views of it, which
    is how the prompt goes through `AttnResLM.forward`. A compiled decode step writes through
    `at(column)` instead: the returned writer copies the new position into column `column` (a (1,)
    long tensor, so the step's shapes and code never depend on the length) and returns the whole
    buffers; attention must then mask the positions not yet filled. The buffers stay finite (zeros
    until written), so a masked position contributes exactly nothing. `reset()` empties the cache and
    keeps the buffers, so a later generation of the same shape reuses their addresses (CUDA graphs
    replay on fixed addresses). On CUDA the buffers are marked as static addresses for `torch.compile`.
    """

    def __init__(self, max_len: int) -> None:
        check_int(max_len, "StaticKVCache max_len")
        super().__init__(max_len)

    def reset(self) -> None:
        """Forget every cached position (lengths back to 0); the buffers are kept for reuse."""
        self.lengths = dict.fromkeys(self.lengths, 0)
        for conv_state, recurrent_state in self.linear.values():
            conv_state.zero_()
            recurrent_state.zero_()

    def at(self, column: torch.Tensor) -> "ColumnWriter":
        """A cache-like writer that puts the next k, v (B, H_kv, 1, hd) at column `column` (1,) of every layer."""
        return ColumnWriter(self, column)

    def _allocate(self, like: torch.Tensor, capacity: int) -> torch.Tensor:
        buffer = like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])
        if buffer.device.type == "cuda":
            torch._dynamo.mark_static_address(buffer)
        return buffer


class ColumnWriter:
    """What attention sees as its cache inside a compiled decode step (see `StaticKVCache.at`)."""

    def __init__(self, cache: StaticKVCache, column: torch.Tensor) -> None:
        self.cache, self.column = cache, column

    def linear_state(self, layer_idx: int):
        """As `KVCache.linear_state` (a linear-attention layer's states are fixed-size: no column)."""
        return self.cache.linear_state(layer_idx)

    def set_linear_state(self, layer_idx: int, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        """As `KVCache.set_linear_state`, in place."""
        self.cache.set_linear_state(layer_idx, conv_state, recurrent_state)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *unused, **ignored) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, 1, hd) into column `self.column` of layer `layer_idx`'s buffers in place;
        return the whole buffers (B, H_kv, max_len, hd)."""
        keys, values = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        keys[:, :, self.column] = k.to(keys.dtype)  # index_put_: inductor writes it in place
        values[:, :, self.column] = v.to(values.dtype)
        return keys, values


def cached_length(cache, layer_idx: int) -> int:
    """How many positions `cache` (an attnres KVCache, a transformers Cache, or None) holds, read
    from attention layer `layer_idx`, as an int. transformers reports a layer's length as an int or,
    for static layers, as a tensor; and from 5.25 on, its default layer (0) may be a linear-attention
    layer whose own count is not the sequence length, so the layer is always named."""
    if cache is None:
        return 0
    return int(cache.get_seq_length(layer_idx))


def linear_states(cache):
    """`cache` as a Kimi Delta Attention layer reads it (`linear_state`, `set_linear_state`): an attnres
    cache as it is, a transformers Cache through its linear-attention methods, None as None."""
    if cache is None or hasattr(cache, "linear_state"):
        return cache
    return TransformersLinearStates(cache)


class TransformersLinearStates:
    """A transformers Cache (e.g. `DynamicCache(config=...)` of a config with `layer_types`) seen
    through attnres's linear-state interface. Its conv state is kept at attnres's width
    (short_conv_kernel_size - 1 inputs), which transformers' layer takes as given."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def linear_state(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        conv_state = self.cache.get_conv_state(layer_idx)
        return None if conv_state is None else (conv_state, self.cache.get_recurrent_state(layer_idx))

    def set_linear_state(self, layer_idx: int, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        self.cache.update_conv_state(conv_state, layer_idx, conv_kernel_size=conv_state.shape[-1])
        self.cache.update_recurrent_state(recurrent_state, layer_idx)
