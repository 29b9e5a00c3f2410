"""The decoder layer, which pairs a token mixer with a feed-forward, each built by its row of a table
(attnres.model.token_mixers, attnres.model.feed_forwards), and the rotary embedding and masks the
decoder computes once for every layer.

Sub-layers know nothing of residuals: each maps a normalised input to its output delta; the
residual scheme decides what they see and where their outputs go. Parameter names follow
Hugging Face's Qwen3 (q_proj, k_norm, gate_proj, input_layernorm, ...).
"""

from __future__ import annotations

import torch
from torch import nn

from attnres.model.feed_forwards import build_feed_forward
from attnres.model.model_config import ModelConfig
from attnres.model.token_mixers import build_token_mixer
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


class DecoderLayer(nn.Module):
    """One transformer layer = two sub-layers, each with its pre-norm: the token mixer (`self_attn`, a
    TokenMixer built by the row of the layer's type in `TOKEN_MIXERS`), then the feed-forward (`mlp`, a
    FeedForward built by its row in `FEED_FORWARDS`: the dense SwiGLU, or a mixture of experts)."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = build_token_mixer(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = build_feed_forward(config, index)

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

