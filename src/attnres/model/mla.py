"""Multi-head latent attention (MLA), Kimi Linear's full-attention layer (DeepSeek-V2/V3's MLA without RoPE).

Every head's keys and values are expanded from one RMS-normed latent of width kv_lora_rank per
position, plus qk_rope_head_dim key channels shared by every head. Only the latent and the shared
key part are cached, (B, 1, T, kv_lora_rank) and (B, 1, T, qk_rope_head_dim): about
(kv_lora_rank + qk_rope_head_dim) / (2 * H * head_dim) of a multi-head cache. As in Kimi Linear no
position is encoded here (the "rope" channels are not rotated; the linear-attention layers carry
position), so the `rope` argument of `forward` is accepted and ignored.

Parameter names are those of transformers' `KimiLinearAttention` (q_proj, or q_a_proj, q_a_layernorm
and q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), so a checkpoint's state dict
loads without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres.common.checks import check_int
from attnres.model.attention_config import MLAConfig
from attnres.model.sublayer_protocols import TokenMixer
from attnres.norm import RMSNorm


class LatentAttention(TokenMixer):
    """Causal multi-head latent attention: x (B, T, D) -> (B, T, D).

    Shapes below: H = num_heads, r = kv_lora_rank, n = qk_nope_head_dim, s = qk_rope_head_dim (the
    shared key part), v = v_head_dim, S = T_past + T.

    norm_eps: the eps of the latent norms (kv_a_layernorm, q_a_layernorm). transformers' Kimi Linear
    builds them with its RMSNorm's default 1e-6, not the model's rms_norm_eps, so 1e-6 matches it.
    attention_bias: a bias on q_a_proj, kv_a_proj_with_mqa and o_proj (q_proj, q_b_proj and kv_b_proj
    never have one), as in transformers.

    As a TokenMixer: its cache holds the latent and shared key per position (a key/value cache), and
    its decode step is not compiled yet.
    """

    not_compiled = "Kimi Linear's latent or delta attention"

    def __init__(self, hidden_size: int, num_heads: int, mla: MLAConfig, attention_bias: bool = False,
                 norm_eps: float = 1e-6) -> None:
        super().__init__()
        check_int(hidden_size, "LatentAttention hidden_size")
        check_int(num_heads, "LatentAttention num_heads")
        mla = MLAConfig.from_dict(mla)
        self.num_heads, self.mla = num_heads, mla
        self.scaling = mla.qk_head_dim ** -0.5  # the whole query/key head, shared part included
        d, h = hidden_size, num_heads
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * mla.qk_head_dim, bias=False)
        else:  # low-rank query: down, norm, up
            self.q_a_proj = nn.Linear(d, mla.q_lora_rank, bias=attention_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, norm_eps)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, h * mla.qk_head_dim, bias=False)
        # One projection gives the latent and the shared key part ("with MQA": one key head for all).
        self.kv_a_proj_with_mqa = nn.Linear(d, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=attention_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, norm_eps)
        # Per head: n key channels then v value channels, from the normed latent.
        self.kv_b_proj = nn.Linear(mla.kv_lora_rank, h * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * mla.v_head_dim, d, bias=attention_bias)

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token of mixing over `seq_len` keys: scores over the whole query/key head
        and the weighted values (attnres.model.flops)."""
        return 2 * seq_len * self.num_heads * (self.mla.qk_head_dim + self.mla.v_head_dim)

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        """One head per position: the shared key part (qk_rope_head_dim) in `dtype`, and the latent
        (kv_lora_rank), which its norm's gain promotes to the weights' dtype under autocast."""
        latent = torch.promote_types(dtype, self.kv_a_layernorm.weight.dtype)
        per_position = self.mla.kv_lora_rank * latent.itemsize + self.mla.qk_rope_head_dim * dtype.itemsize
        return batch * positions * per_position

    def forward(self, x: torch.Tensor, rope=None, cache=None, layer_idx: int = 0,
                mask: torch.Tensor | None = None, real: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D). `rope` and `real` are ignored (no position is encoded, the mask says
        which keys are real; taken so that every token mixer is called alike).

        cache: None, or an object with `update(latent, k_shared, layer_idx) -> (latent_all, k_shared_all)`
        (attnres.model.KVCache or a Hugging Face Cache) given the normed latent (B, 1, T, r) and the
        shared key part (B, 1, T, s) of the new positions. mask: None (causal; a new query sees every
        cached position and the new ones up to itself), or a boolean (B, 1, T, S), True = may attend
        (`attnres.model.layers.padded_causal_mask`), or (B, 1, 1, capacity) for a static cache.
        """
        b, t, _ = x.shape
        mla, h = self.mla, self.num_heads
        q = self.q_proj(x) if mla.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, h, mla.qk_head_dim).transpose(1, 2)  # (B, H, T, n + s)
        latent, k_shared = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        # As one-head (B, 1, T, .) tensors, the shape every cache stores.
        latent = self.kv_a_layernorm(latent).unsqueeze(1)
        k_shared = k_shared.unsqueeze(1)
        if cache is not None:
            latent, k_shared = cache.update(latent, k_shared, layer_idx)
        if t == 1:  # decoding: cheaper to absorb kv_b_proj into one query than to expand all S positions
            out = self._attend_in_latent_space(q, latent, k_shared, mask)
        else:
            out = self._attend_expanded(q, latent, k_shared, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * mla.v_head_dim))

    def _attend_expanded(self, q: torch.Tensor, latent: torch.Tensor, k_shared: torch.Tensor,
                         mask: torch.Tensor | None) -> torch.Tensor:
        """Per-head keys and values expanded from the latent: q (B, H, T, n + s), latent (B, 1, S, r),
        k_shared (B, 1, S, s) -> (B, H, T, v). Cheapest when many queries share the expansion (prefill,
        training)."""
        mla, h = self.mla, self.num_heads
        b, _, s, _ = latent.shape
        t = q.shape[2]
        kv = self.kv_b_proj(latent).view(b, s, h, mla.qk_nope_head_dim + mla.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
        k = torch.cat((k_nope, k_shared.expand(-1, h, -1, -1)), dim=-1)  # (B, H, S, n + s)
        past = s - t
        if mask is None and past > 0:  # new query i sees every cached key and new keys up to itself
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=past)
        # SDPA's fused kernels (flash on CPU and CUDA) want one head width for q, k and v, else it falls
        # back to the unfused math (scores materialised, slower forward and backward). Zero
        # value channels leave the real ones unchanged; MLA checkpoints have v_head_dim < qk_head_dim.
        pad = mla.qk_head_dim - mla.v_head_dim
        if pad > 0:
            v = F.pad(v, (0, pad))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scaling)
        return out[..., :mla.v_head_dim] if pad > 0 else out

    def _attend_in_latent_space(self, q: torch.Tensor, latent: torch.Tensor, k_shared: torch.Tensor,
                                mask: torch.Tensor | None) -> torch.Tensor:
        """One new query per row (decoding), with kv_b_proj absorbed into the query and the output
        instead of expanding every cached position: q (B, H, 1, n + s) -> (B, H, 1, v).

        q_nope . (W_k latent_j) = (W_k^T q_nope) . latent_j and sum_j p_j W_v latent_j = W_v sum_j p_j latent_j,
        so every head attends to the cache as it is stored: scores against latent (B, 1, S, r) and
        k_shared (B, 1, S, s), values latent. The heads stand in as H query rows of one head, so the
        cache is read in place, never expanded, copied per head or concatenated (torch.cat of latent and
        k_shared, to call SDPA, would copy the whole cache every step; with one query the scores are
        small enough to form explicitly). O(S (2r + s)) per head instead of O(S r (n + v)).
        """
        mla, h = self.mla, self.num_heads
        b = q.shape[0]
        q_nope, q_shared = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        w_k, w_v = self.kv_b_proj.weight.view(h, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank).split(
            [mla.qk_nope_head_dim, mla.v_head_dim], dim=1)  # (H, n, r), (H, v, r)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_k).reshape(b, 1, h, mla.kv_lora_rank)
        q_shared = q_shared.reshape(b, 1, h, mla.qk_rope_head_dim)
        scores = (q_latent @ latent.transpose(-1, -2) + q_shared @ k_shared.transpose(-1, -2)) * self.scaling
        if mask is not None:  # (B, 1, 1, S) broadcasts over the H query rows as it would over heads
            scores = scores.masked_fill(~mask, float("-inf"))
        # Softmax in at least fp32, as SDPA does for low-precision inputs (float64 stays float64).
        weights = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(latent.dtype)
        out = (weights @ latent).reshape(b, h, mla.kv_lora_rank)  # (B, H, r): each head's mix of latents
        return torch.einsum("bhr,hvr->bhv", out, w_v).unsqueeze(2)
