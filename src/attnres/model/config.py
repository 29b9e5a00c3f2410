"""ModelConfig: the decoder's shape and its residual scheme, validated at construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from attnres.common.checks import check_bool, check_choice, check_int, check_positive_number
from attnres.common.errors import InputError
from attnres.residual import (STREAM_OPTIONS, VARIANTS, check_chunk_size, check_residual, check_router_options,
                              check_stream_options, router_options, stream_options, valid_num_blocks)
from attnres.routing import IMPLS

# The built-in residual variants (the variant table at import); `attnres.residual.VARIANTS` also
# holds any registered later.
RESIDUALS = tuple(VARIANTS)

# ModelConfig field -> the name transformers' configs and generation utilities use.
HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "tie_embeddings": "tie_word_embeddings",
            "rope_theta": "attnres_rope_theta", "norm_eps": "rms_norm_eps",
            "max_seq_len": "max_position_embeddings", "init_std": "initializer_range"}


# The router ablations' fields (method §7): a variant of a comparison may set them.
ROUTER_ABLATION_FIELDS = ("router_query", "router_weights", "router_key_norm")
# DenseFormer's averaging layout (method §7): a variant of a comparison may set them too.
DENSEFORMER_FIELDS = ("denseformer_dilation", "denseformer_period")
# The stream variants' options (method §7.3): hc_streams, hc_dynamic, hc_sinkhorn_iters.
STREAM_FIELDS = tuple(STREAM_OPTIONS)


class ConfigError(InputError):
    """An invalid configuration value; the message names the field and the allowed values."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a Qwen3-architecture decoder and the residual scheme that connects its sub-layers.

    `residual` is a name of the variant table (`attnres.residual.VARIANTS`). `num_blocks` (block
    variants only) counts blocks of sub-layers (a transformer layer has two). `exact_conversion`
    (delta_block only) makes the zero-query model reproduce a standard model: "gate" adds a
    zero-initialised scalar gate per router, "partial" adds the current block's partial sum as a
    source (method §4).
    `head_dim=None` means hidden_size // num_heads. `qk_norm` (per-head RMSNorm on queries and
    keys) is Qwen3's; Llama and Mistral have none. `attention_bias` adds q/k/v biases (Qwen2).
    `routing_impl` (one of `attnres.routing.IMPLS`) picks how routers compute, never what they compute.
    `routing_chunk_size` (full_attnres and delta_attnres only) is the number of consecutive routers
    that the fast paths route together (chunked two-phase routing, docs/explanation/fast-paths.md); None picks
    round(sqrt(number of routers)), 1 routes every router alone. It never changes the function either.
    `router_query` ("static" | "input_dependent"), `router_weights` ("softmax" | "sigmoid") and
    `router_key_norm` are the Kimi paper's router ablations (method §7, `attnres.routing.Router`),
    for routed variants only; the defaults are the method. Ablated routers compute with the
    reference code (docs/explanation/contenders.md). `denseformer_dilation` k and `denseformer_period` p
    (residual "denseformer" only): an average after every p-th layer, over every k-th state
    (Pagliardini et al.'s k x p DenseFormer; 1 and 1 average after every layer over all states).
    `hc_streams` n (hyper_connections and mhc; None: 4), `hc_dynamic` (hyper_connections; None:
    True, the dynamic form) and `hc_sinkhorn_iters` (mhc; None: 20): the stream variants (method
    §7.3); None is replaced by the default at construction, and stays None for other variants.
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
    routing_chunk_size: int | None = None
    router_query: str = "static"
    router_weights: str = "softmax"
    router_key_norm: bool = True
    denseformer_dilation: int = 1
    denseformer_period: int = 1
    hc_streams: int | None = None
    hc_dynamic: bool | None = None
    hc_sinkhorn_iters: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_seq_len"):
            check_int(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"ModelConfig.head_dim: hidden_size={self.hidden_size} is not divisible by "
                    f"num_heads={self.num_heads}; give head_dim explicitly (a positive even integer)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        check_int(self.head_dim, "ModelConfig.head_dim", error=ConfigError)
        if self.head_dim % 2:
            raise ConfigError(f"ModelConfig.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_kv_heads must divide num_heads={self.num_heads}; allowed values: "
                f"{[d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]}, got {self.num_kv_heads}")
        for name in ("rope_theta", "norm_eps", "init_std"):
            check_positive_number(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        for name in ("tie_embeddings", "qk_norm", "attention_bias"):
            check_bool(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        check_choice(self.routing_impl, "ModelConfig.routing_impl", IMPLS, error=ConfigError)
        check_residual(self.residual, self.num_layers, self.num_blocks, self.exact_conversion,
                       prefix="ModelConfig.", error=ConfigError, dilation=self.denseformer_dilation,
                       period=self.denseformer_period)
        check_router_options(self.residual, self.router_query, self.router_weights, self.router_key_norm,
                             self.routing_impl, prefix="ModelConfig.", error=ConfigError)
        streams = {name: getattr(self, name) for name in STREAM_FIELDS}
        check_stream_options(self.residual, self.routing_impl, prefix="ModelConfig.", error=ConfigError, **streams)
        for name, value in stream_options(self.residual, **streams).items():
            object.__setattr__(self, name, value)
        self._check_chunk_size()

    def _check_chunk_size(self) -> None:
        variant = VARIANTS[self.residual]
        per_sublayer = [name for name, v in VARIANTS.items() if v.sources == "sublayers"]
        check_chunk_size(self.routing_chunk_size, self.num_sublayers + (variant.mode == "replace"),
                         variant.sources == "sublayers", name="ModelConfig.routing_chunk_size",
                         applies_to=f"residual in {per_sublayer} (block variants route each block together)",
                         error=ConfigError)

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
    exact_conversion, the router ablations, the stream options) and a comparison's query_init, e.g.
    "block_attnres (N=4)", "hyper_connections [static]",
    "delta_block (N=2) [gate]" or "block_attnres (N=8) [q~N(0,0.02)]"."""
    name = fields["residual"]
    if fields.get("num_blocks"):
        name += f" (N={fields['num_blocks']})"
    layout = (fields.get("denseformer_dilation") or 1, fields.get("denseformer_period") or 1)
    if layout != (1, 1):
        name += f" ({layout[0]}x{layout[1]})"  # the paper's k x p DenseFormer
    defaults = stream_options(fields["residual"])
    if fields.get("hc_streams") not in (None, defaults["hc_streams"]):
        name += f" (n={fields['hc_streams']})"
    if fields.get("hc_dynamic") is False:
        name += " [static]"
    if fields.get("hc_sinkhorn_iters") not in (None, defaults["hc_sinkhorn_iters"]):
        name += f" [{fields['hc_sinkhorn_iters']} sinkhorn]"
    if fields.get("exact_conversion"):
        name += f" [{fields['exact_conversion']}]"
    if fields.get("query_init") == "normal":
        name += " [q~N(0,0.02)]"
    for ablation in router_ablation_labels(fields):
        name += f" [{ablation}]"
    return name


def router_ablation_labels(fields: dict) -> list[str]:
    """Short labels of the router ablations set in ModelConfig fields, e.g. ["input query", "sigmoid"]."""
    ablated = router_options(fields.get("router_query", "static"), fields.get("router_weights", "softmax"),
                             fields.get("router_key_norm", True))
    labels = {"query": "input query", "weights": ablated.get("weights"), "key_norm": "no key norm"}
    return [labels[name] for name in ablated]

