"""How close decoding comes to the memory limit: the bytes one decode step reads, and the machine's
copy bandwidth to compare them with.

Decoding one token for a small batch does little arithmetic per byte: every weight matrix is read
once, and attention reads its keys and values. So a step can be no faster than (bytes read) /
(memory bandwidth), and the achieved bandwidth, bytes read per second of decoding, says how far a
decoder is from that limit. The limit here is measured, not taken from a data sheet: a large tensor
copy with torch's current threads, counting the bytes read and the bytes written.

What a step reads (`decode_bytes_per_step`):
- every parameter once, except the input embedding table, of which only the batch's rows are read
  (when the head is tied to it, the head reads it whole, so it counts once);
- the KV cache, as each layer's token mixer says (`TokenMixer.decode_cache_bytes`): a static cache
  is read whole by the masked attention, every layer's keys and values (a latent-attention layer's
  latent and shared key) at the cache's capacity; a linear-attention layer's fixed-size states once.
Activations (the hidden state, the routers' sources, a few KB per token at batch 1) are left out.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

GB = 1e9
COPY_BYTES = 256 * 2**20  # a copy far larger than any CPU cache, so it runs at memory speed


def weight_bytes_per_step(model: nn.Module, batch: int = 1) -> int:
    """Bytes of parameters one decode step of `batch` rows reads: all of them once, the input
    embedding table only one row per row of the batch (unless the head shares it)."""
    if hasattr(model, "get_input_embeddings"):  # a transformers model
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    else:  # an AttnResLM, or any module naming them as it does
        embedding, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    table = getattr(embedding, "weight", None)
    shared = head is not None and getattr(head, "weight", None) is table
    total = 0
    for parameter in model.parameters():  # a tied weight comes once
        if parameter is table and not shared:
            total += batch * parameter.shape[1] * parameter.element_size()
        else:
            total += parameter.numel() * parameter.element_size()
    return total


def cache_bytes_per_step(num_layers: int, batch: int, num_kv_heads: int, head_dim: int, positions: int,
                         element_size: int) -> int:
    """Bytes of keys and values attention reads in one step: (keys + values) x layers x batch x
    KV heads x `positions` x head_dim x element size (positions: a static cache's capacity)."""
    return 2 * num_layers * batch * num_kv_heads * positions * head_dim * element_size


def held_cache_bytes(cache) -> int:
    """Bytes of every tensor an attnres static cache holds: each layer's key and value buffers at
    their capacity and each linear-attention layer's states."""
    tensors = [*cache.keys.values(), *cache.values.values(), *(t for pair in cache.linear.values() for t in pair)]
    return sum(t.numel() * t.element_size() for t in tensors)


def decode_bytes_per_step(model: nn.Module, cache, batch: int) -> int:
    """Weights and cache read by one decode step of `batch` rows of `model` (an AttnResLM) with an
    attnres static cache: the cache's bytes as each layer's token mixer reads them (module doc)."""
    read = sum(layer.self_attn.decode_cache_bytes(cache, i) for i, layer in enumerate(model.layers))
    return weight_bytes_per_step(model, batch) + read


def median_pass_seconds(run: Callable[[], object], repeats: int) -> float:
    """The median seconds of `repeats` timed calls of `run` after one untimed call (page faults and
    clock ramp are not bandwidth)."""
    run()
    seconds = []
    for _ in range(repeats):
        begin = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - begin)
    return statistics.median(seconds)


@functools.cache
def _copy_bandwidth(threads: int, repeats: int) -> float:
    source = torch.ones(COPY_BYTES // 4)
    target = torch.empty_like(source)
    return 2 * COPY_BYTES / median_pass_seconds(lambda: target.copy_(source), repeats) / GB


def copy_bandwidth_gb_s(repeats: int = 7) -> float:
    """Measured CPU memory bandwidth in GB/s: bytes read + written per second by a 256 MiB fp32 tensor
    copy with torch's current thread count, median of `repeats` (about 0.3 s; once per process and
    thread count)."""
    return _copy_bandwidth(torch.get_num_threads(), repeats)


__all__ = ["cache_bytes_per_step", "copy_bandwidth_gb_s", "decode_bytes_per_step", "held_cache_bytes",
           "median_pass_seconds", "weight_bytes_per_step"]
