"""ModelConfig: the decoder's shape and its residual scheme, validated at construction."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

RESIDUALS = ("standard", "full_attnres", "block_attnres", "delta_attnres", "delta_block")
BLOCK_RESIDUALS = ("block_attnres", "delta_block")
EXACT_CONVERSIONS = ("gate", "partial")
# How routers compute (same function, different speed): "auto" = Triton on CUDA when available,
# else the memory-lean custom op; "reference" = the plain METHOD §2 code every path is tested against.
ROUTING_IMPLS = ("auto", "reference", "lean", "triton")
# ModelConfig field -> the name transformers' configs and generation utilities use.
HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "tie_embeddings": "tie_word_embeddings",
            "rope_theta": "attnres_rope_theta", "norm_eps": "rms_norm_eps",
            "max_seq_len": "max_position_embeddings", "init_std": "initializer_range"}


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and the allowed values."""


def valid_num_blocks(num_sublayers: int) -> list[int]:
    """Block counts N that split `num_sublayers` into exactly N blocks of size ceil(2L / N).

    METHOD §3.2: blocks hold S = ceil(2L / N) sub-layers, the last one possibly shorter; an N for
    which that gives fewer than N blocks (2L = 12, N = 5 -> S = 3, 4 blocks) is not valid.
    """
    return [n for n in range(1, num_sublayers + 1) if math.ceil(num_sublayers / math.ceil(num_sublayers / n)) == n]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a Qwen3-architecture decoder and the residual scheme that connects its sub-layers.

    `residual` is one of `RESIDUALS`. `num_blocks` (block variants only) counts blocks of
    sub-layers (a transformer layer has two). `exact_conversion` (delta_block only) makes the
    zero-query model reproduce a standard model: "gate" adds a zero-initialised scalar gate per
    router, "partial" adds the current block's partial sum as a source (METHOD §4).
    `head_dim=None` means hidden_size // num_heads. `qk_norm` (per-head RMSNorm on queries and
    keys) is Qwen3's; Llama and Mistral have none. `attention_bias` adds q/k/v biases (Qwen2).
    `routing_impl` (one of `ROUTING_IMPLS`) picks how routers compute, never what they compute.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    intermediate_size: int
    residual: str = "standard"
    num_blocks: int | None = None
    exact_conversion: str | None = None
    tie_embeddings: bool = True
    qk_norm: bool = True
    attention_bias: bool = False
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    max_seq_len: int = 2048
    init_std: float = 0.02
    routing_impl: str = "auto"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_seq_len"):
            _require_positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"ModelConfig.head_dim: hidden_size={self.hidden_size} is not divisible by "
                    f"num_heads={self.num_heads}; give head_dim explicitly (a positive even integer)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ConfigError(f"ModelConfig.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_kv_heads must divide num_heads={self.num_heads}; allowed values: "
                f"{[d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]}, got {self.num_kv_heads}")
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"ModelConfig.{name} must be a positive number, got {value!r}")
        for name in ("tie_embeddings", "qk_norm", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"ModelConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.routing_impl not in ROUTING_IMPLS:
            raise ConfigError(f"ModelConfig.routing_impl must be one of {list(ROUTING_IMPLS)}, got {self.routing_impl!r}")
        self._validate_residual()

    def _validate_residual(self) -> None:
        if self.residual not in RESIDUALS:
            raise ConfigError(f"ModelConfig.residual must be one of {list(RESIDUALS)}, got {self.residual!r}")
        valid = valid_num_blocks(self.num_sublayers)
        if self.residual in BLOCK_RESIDUALS:
            if self.num_blocks is None:
                raise ConfigError(
                    f"ModelConfig.num_blocks is required for residual={self.residual!r}; allowed values "
                    f"for num_layers={self.num_layers}: {valid}")
            if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) \
                    or not 1 <= self.num_blocks <= self.num_sublayers:
                raise ConfigError(
                    f"ModelConfig.num_blocks must be an integer from 1 to 2 * num_layers = {self.num_sublayers} "
                    f"(blocks count sub-layers); allowed values: {valid}, got {self.num_blocks!r}")
            if self.num_blocks not in valid:
                size = math.ceil(self.num_sublayers / self.num_blocks)
                raise ConfigError(
                    f"ModelConfig.num_blocks={self.num_blocks} gives blocks of {size} sub-layers and only "
                    f"{math.ceil(self.num_sublayers / size)} blocks for {self.num_sublayers} sub-layers; "
                    f"allowed values: {valid}")
        elif self.num_blocks is not None:
            raise ConfigError(
                f"ModelConfig.num_blocks applies only to residual in {list(BLOCK_RESIDUALS)}; "
                f"leave it None for residual={self.residual!r} (got {self.num_blocks!r})")
        if self.exact_conversion is not None:
            if self.residual != "delta_block":
                raise ConfigError(
                    f"ModelConfig.exact_conversion applies only to residual='delta_block'; leave it None "
                    f"for residual={self.residual!r} (got {self.exact_conversion!r})")
            if self.exact_conversion not in EXACT_CONVERSIONS:
                raise ConfigError(
                    f"ModelConfig.exact_conversion must be None or one of {list(EXACT_CONVERSIONS)}, "
                    f"got {self.exact_conversion!r}")

    @property
    def num_sublayers(self) -> int:
        """2L: attention and MLP sub-layers alternate, attention first."""
        return 2 * self.num_layers

    def to_dict(self) -> dict:
        """Plain dict of every field (round-trips through `ModelConfig(**d)`)."""
        return asdict(self)

    def to_hf_dict(self) -> dict:
        """The fields under Hugging Face's names: a `config.json` for `AttnResForCausalLM`."""
        values = self.to_dict()
        renamed = {HF_NAMES.get(name, name): value for name, value in values.items()}
        return {"model_type": "attnres", "architectures": ["AttnResForCausalLM"], **renamed}

    @classmethod
    def from_hf_dict(cls, values: dict) -> "ModelConfig":
        """Inverse of `to_hf_dict` (other keys of a config.json are ignored)."""
        ours = {f.name for f in fields(cls)}
        back = {hf: name for name, hf in HF_NAMES.items()}
        return cls(**{back.get(key, key): value for key, value in values.items() if back.get(key, key) in ours})

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """Build from a dict, rejecting unknown keys by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"ModelConfig: unknown field(s) {unknown}; allowed fields: {sorted(known)}")
        return cls(**values)


def variant_name(fields: dict) -> str:
    """Display name of a residual variant from ModelConfig fields (residual, num_blocks,
    exact_conversion) and a comparison's query_init, e.g. "block_attnres (N=4)",
    "delta_block (N=2) [gate]" or "block_attnres (N=8) [q~N(0,0.02)]"."""
    name = fields["residual"]
    if fields.get("num_blocks"):
        name += f" (N={fields['num_blocks']})"
    if fields.get("exact_conversion"):
        name += f" [{fields['exact_conversion']}]"
    if fields.get("query_init") == "normal":
        name += " [q~N(0,0.02)]"
    return name


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
