"""Options of Kimi Linear's two token mixers, validated at construction: multi-head latent attention
(`MLAConfig`, attnres.model.mla) and Kimi Delta Attention (`KDAConfig`, attnres.model.kda).

Kept apart from the modules so that ModelConfig can hold them without importing the sub-layers.
Field names are those of transformers' KimiLinearConfig (for KDA, its `linear_attn_config`), so a
checkpoint's config.json reads across unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnres.common.checks import check_int, dataclass_from_dict


@dataclass(frozen=True, kw_only=True)
class MLAConfig:
    """Multi-head latent attention, Kimi Linear's full-attention layers (DeepSeek-V2/V3's MLA).

    Keys and values of every head are expanded from one latent of width kv_lora_rank (RMS-normed);
    only the latent and the shared key part are cached. A query/key head has qk_nope_head_dim
    per-head channels plus qk_rope_head_dim channels shared by every head's key; a value head has
    v_head_dim. As in Kimi Linear, no position is encoded: the "rope" part is not rotated (the
    linear-attention layers carry position). q_lora_rank: None, a full query projection; an
    integer, a low-rank one with its own norm.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_int(getattr(self, name), f"MLAConfig.{name}")
        check_int(self.q_lora_rank, "MLAConfig.q_lora_rank", allow_none=True)

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head: qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_dict(cls, values: "MLAConfig | dict") -> "MLAConfig":
        """An MLAConfig from itself or a dict of its fields."""
        return dataclass_from_dict(cls, values, "mla")


@dataclass(frozen=True, kw_only=True)
class KDAConfig:
    """Kimi Delta Attention, Kimi Linear's linear-attention layers.

    num_heads heads of width head_dim for queries, keys and values alike; short_conv_kernel_size: the
    causal depthwise convolution over time on q, k and v (SiLU after it).
    """

    num_heads: int
    head_dim: int
    short_conv_kernel_size: int = 4

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "short_conv_kernel_size"):
            check_int(getattr(self, name), f"KDAConfig.{name}")

    @classmethod
    def from_dict(cls, values: "KDAConfig | dict") -> "KDAConfig":
        """A KDAConfig from itself or a dict of its fields."""
        return dataclass_from_dict(cls, values, "kda")
