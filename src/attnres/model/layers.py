"""Qwen3-architecture sub-layers: rotary embedding, grouped-query attention, and the decoder layer that pairs
a token mixer with a feed-forward. The token mixer is the one its layer type's row of the table
(attnres.model.token_mixers) builds: grouped-query attention, or Kimi Linear's latent attention
(mla.py) for "full_attention", Kimi Delta Attention (kda.py) for "linear_attention"; both rows are
registered here. The feed-forward is the SwiGLU `MLP` of mlp.py or the mixture of experts of moe.py.

Sub-layers know nothing of residuals: each maps a normalised input to its output delta; the
residual scheme decides what they see and where their outputs go. Parameter names follow
Hugging Face's Qwen3 (q_proj, k_norm, gate_proj, input_layernorm, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres.model.cache import RECURRENT_STATE
from attnres.model.model_config import ModelConfig
from attnres.model.kda import KimiDeltaAttention
from attnres.model.mla import LatentAttention
from attnres.model.mlp import MLP
from attnres.model.moe import MixtureOfExperts
from attnres.model.token_mixers import TokenMixer, TokenMixerType, build_token_mixer, register_token_mixer
from attnres.norm import RMSNorm


class RotaryEmbedding(nn.Module):
    """cos/sin tables for rotary position embedding (rotate-half convention, as Qwen3/Llama)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (..., T) -> cos, sin of shape (..., T, head_dim) in `dtype`, computed in >= fp32.

        (T,) positions shared by the batch give (T, head_dim) tables; per-row positions of a padded
        batch, shaped (B, 1, T), give (B, 1, T, head_dim), which broadcasts over the heads."""
        # Frequencies in fp32, as Qwen3/Llama checkpoints were trained with, so conversions match
        # exactly; recomputed per call (head_dim / 2 values) rather than held in a buffer, which a
        # meta-device construction (transformers' from_pretrained) would leave uninitialised.
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        inv_freq = 1.0 / (self.theta ** exponents)
        compute = torch.promote_types(dtype, torch.float32)
        angles = positions.to(compute)[..., None] * inv_freq.to(compute)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd) rotated by position: x * cos + rotate_half(x) * sin; cos, sin (T, hd) or (B, 1, T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def padded_positions(attention_mask: torch.Tensor, new: int) -> torch.Tensor:
    """Rotary positions (B, new) of the last `new` columns of attention_mask (B, T_past + new).

    A real token's position is the number of real tokens before it (as transformers' Llama and
    Qwen3 under `generate`), so a padded row rotates its tokens exactly as the row alone would.
    A left pad gets position 0 and a right pad its last real token's position: harmless, since no
    real token attends to a pad.
    """
    real_before = attention_mask.long().cumsum(-1) - 1
    return real_before[:, attention_mask.shape[1] - new:].clamp(min=0)


def padded_causal_mask(attention_mask: torch.Tensor, new: int) -> torch.Tensor:
    """SDPA boolean mask (B, 1, new, T_past + new), True = may attend, from attention_mask (B, T_past + new).

    New query i (absolute column T_past + i) sees the real keys up to itself, and always its own
    key: a left pad's row would otherwise see no key at all and SDPA would give NaN; its own key
    keeps it finite, and its output belongs to a pad, which no real token reads.
    """
    total = attention_mask.shape[1]
    past = total - new
    query_column = torch.arange(past, total, device=attention_mask.device)[:, None]
    key_column = torch.arange(total, device=attention_mask.device)[None, :]
    causal = key_column <= query_column
    own_key = key_column == query_column
    return causal & (attention_mask.bool()[:, None, None, :] | own_key)


class Attention(TokenMixer):
    """Causal grouped-query attention with per-head RMSNorm on queries and keys (Qwen3): a TokenMixer
    with a key/value cache whose decode step compiles."""

    def __init__(self, config: ModelConfig) -> None:
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


class DecoderLayer(nn.Module):
    """One transformer layer = two sub-layers, each with its pre-norm: the token mixer (`self_attn`, a
    TokenMixer built by the row of the layer's type in `TOKEN_MIXERS`), then the feed-forward (the
    dense SwiGLU `MLP`, or from `config.moe.dense_layers` on a `MixtureOfExperts`)."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = build_token_mixer(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        if config.moe is not None and index >= config.moe.dense_layers:
            self.mlp = MixtureOfExperts(config.hidden_size, config.moe)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def attention_delta(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache=None,
                        layer_idx: int = 0, mask: torch.Tensor | None = None,
                        real: torch.Tensor | None = None) -> torch.Tensor:
        """Even sub-layer: f(Norm(h)), (B, T, D) -> (B, T, D); `cache` and `mask` as in Attention.forward.
        real: None, or (B, T) bool, True at the new positions' real tokens (a padded batch), which a
        linear-attention layer needs (it has no mask: pads are zeroed instead)."""
        return self.self_attn(self.input_layernorm(h), rope, cache, layer_idx, mask, real)

    def mlp_delta(self, h: torch.Tensor) -> torch.Tensor:
        """Odd sub-layer: f(Norm(h)), (B, T, D) -> (B, T, D)."""
        return self.mlp(self.post_attention_layernorm(h))


def _full_attention(config: ModelConfig, index: int) -> TokenMixer:
    """Softmax attention over the sequence: latent attention where `config.mla` is set, else grouped-query."""
    if config.mla is not None:
        # The latent norms keep their own eps of 1e-6 (LatentAttention's doc), not norm_eps.
        return LatentAttention(config.hidden_size, config.num_heads, config.mla, config.attention_bias)
    return Attention(config)


def _linear_attention(config: ModelConfig, index: int) -> TokenMixer:
    """Kimi Delta Attention (ModelConfig requires `kda` for these layers)."""
    return KimiDeltaAttention(config.hidden_size, config.kda, config.norm_eps)


# The built-in rows of the layer-type table (transformers' `layer_types` names).
for _row in (TokenMixerType("full_attention", _full_attention),
             TokenMixerType("linear_attention", _linear_attention, cache_state=RECURRENT_STATE, requires=("kda",))):
    register_token_mixer(_row)
