"""Grouped-query attention with Qwen3's per-head RMSNorm on queries and keys: the token mixer of
"full_attention" layers (attnres.model.token_mixers). Parameter names are Hugging Face's Qwen3
(q_proj, k_norm, ...)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres.model.sublayer_protocols import TokenMixer
from attnres.norm import RMSNorm


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd) rotated by position: x * cos + rotate_half(x) * sin; cos, sin (T, hd) or (B, 1, T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(TokenMixer):
    """Causal grouped-query attention with per-head RMSNorm on queries and keys (Qwen3): a TokenMixer
    with a key/value cache whose decode step compiles."""

    def __init__(self, config) -> None:  # config: a ModelConfig
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        d = config.hidden_size
        bias = config.attention_bias
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token of mixing over `seq_len` keys: Q K^T and A V (attnres.model.flops)."""
        return 4 * seq_len * self.num_heads * self.head_dim

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        """Keys and values, batch x KV heads x positions x head_dim each: values in `dtype`, keys in it
        promoted with the weights' dtype (under autocast the norm's gain and the rotary tables, in the
        stream's dtype, promote them, as in transformers)."""
        keys = torch.promote_types(dtype, self.k_proj.weight.dtype)
        return batch * self.num_kv_heads * positions * self.head_dim * (keys.itemsize + dtype.itemsize)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache=None,
                layer_idx: int = 0, mask: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D), rope = (cos, sin) each (T, hd) or (B, 1, T, hd) for the T new positions -> (B, T, D).

        cache: None, or an object with `update(k, v, layer_idx) -> (k_all, v_all)` (attnres.model.KVCache
        or a Hugging Face Cache) holding the keys and values of earlier positions. mask: None (causal
        attention, every key real), or a boolean (B, 1, T, T_past + T) of the keys each new query may
        see (`padded_causal_mask`), for padded batches, or (B, 1, 1, capacity) for a static cache
        (`attnres.generation.fast_generator`). real: unused (the mask says which keys are real).
        """
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        # Grouped-query attention inside SDPA (each KV head serves num_heads / num_kv_heads query
        # heads), so the keys and values, a whole static cache when decoding, are never copied per group.
        gqa = self.num_heads != self.num_kv_heads
        past = k.shape[2] - t
        if mask is not None:  # a padded batch or a static cache: which keys each query sees is in the mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif past == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif t == 1:  # one new token (decoding) sees every key: no mask to build
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        else:  # new query i sees every cached key and new keys up to itself
            allowed = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(diagonal=past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))
