"""ModelConfig: the decoder's shape and its residual scheme, validated at construction."""

from __future__ import annotations

import copy
from dataclasses import MISSING, asdict, dataclass, field, fields

from attnres.common.checks import check_bool, check_int, check_positive_number, divisors_hint, required_fields
from attnres.common.errors import InputError
from attnres import compat
from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.cache import KV_STATE
from attnres.model.feed_forwards import FEED_FORWARDS, feed_forward_type
from attnres.model.moe_config import MoEConfig
from attnres.model.token_mixers import TOKEN_MIXERS
from attnres.residual import VARIANTS, VariantOptions, resolve_options, valid_num_blocks, variant_label
from attnres.residual.legacy import upgrade_model_fields

# What a layer's token mixer is: a name of the layer-type table (attnres.model.token_mixers): softmax
# attention over the sequence (grouped-query, or latent with `mla`), Kimi Delta Attention (with
# `kda`), or a registered one.
LAYER_TYPES = TOKEN_MIXERS
# A vocabulary not yet known: a run file's model.vocab_size until its tokenizer is read
# (`ModelConfig.with_vocab_size`); a model cannot be built before.
AUTO_VOCAB = "auto"
MAX_LAYERS = 4096  # far deeper than any model trained (a few hundred layers); the checks are linear in depth
FULL_ATTENTION_EVERY = 4  # Kimi Linear's 3:1 pattern: every 4th layer full attention, the rest linear
# Where that pattern's first full-attention layer sits (0-based), in the two defaults that differ:
# ModelConfig's with `kda` and no layer_types (1-based 4, 8, ..., as the released checkpoints'
# `full_attn_layers`), and transformers' KimiLinearConfig's for a config.json with neither
# layer_types nor full_attn_layers (`i and i % 4 == 0`: 0-based 4, 8, ...), which conversion follows.
KIMI_FIRST_FULL_ATTNRES = 3
KIMI_FIRST_FULL_TRANSFORMERS = 4


def kimi_linear_layer_types(num_layers: int, first_full: int, full: str = "full_attention") -> tuple[str, ...]:
    """Kimi Linear's 3:1 pattern over `num_layers` layers: `full` (softmax attention) at 0-based layers
    first_full, first_full + FULL_ATTENTION_EVERY, ..., linear attention elsewhere."""
    return tuple(full if i >= first_full and (i - first_full) % FULL_ATTENTION_EVERY == 0
                 else "linear_attention" for i in range(num_layers))


def default_layer_types(num_layers: int, linear: bool, latent: bool = False) -> tuple[str, ...]:
    """Every layer softmax attention, latent with `latent`; with `linear`, Kimi Linear's 3:1 pattern
    (every 4th layer softmax attention, counting from 1, the rest linear: `full_attn_layers` 4, 8, ...
    of its checkpoints)."""
    full = "latent_attention" if latent else "full_attention"
    if not linear:
        return (full,) * num_layers
    return kimi_linear_layer_types(num_layers, KIMI_FIRST_FULL_ATTNRES, full)


# The built-in residual variants (the variant table at import); `attnres.residual.VARIANTS` also
# holds any registered later.
RESIDUALS = tuple(VARIANTS)


def hf_field(hf_name: str | None = None, *, default=MISSING, hf_default=MISSING, hf_type: str | None = None):
    """A ModelConfig field declared with how Hugging Face's config (`attnres.hf.AttnResConfig`, whose
    fields are generated from these) spells it: `hf_name`, the name transformers' configs and
    generation utilities use (default: the field's own); `hf_default`, the default there of a field
    ModelConfig requires; `hf_type`, its JSON type there where it differs (an options object: a dict)."""
    metadata = {"hf": hf_name} if hf_name else {}
    if hf_default is not MISSING:
        metadata["hf_default"] = hf_default
    if hf_type:
        metadata["hf_type"] = hf_type
    return field(default=default, metadata=metadata)


def hf_names(config_class: type) -> dict[str, str]:
    """{field: its Hugging Face name} of a ModelConfig class, for the fields named otherwise there."""
    return {f.name: f.metadata["hf"] for f in fields(config_class) if "hf" in f.metadata}


class ConfigError(InputError):
    """An invalid configuration value; the message names the field and the allowed values."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """What a Qwen3-architecture decoder computes: its shape and the residual scheme between sub-layers.

    `residual` is a name of the variant table (`attnres.residual.VARIANTS`) and `residual_options`
    its options (`VARIANTS[residual].options`, a frozen dataclass; docs/reference/config.md lists
    every variant's), given as that object, a dict of its fields, or None for the defaults, and
    stored as the object. Block AttnRes and Delta Block need `num_blocks`.
    `moe`: a mixture-of-experts feed-forward (`attnres.model.moe_config.MoEConfig`, or a dict of
    its fields) in every layer from `moe.dense_layers` on; None: the dense SwiGLU everywhere.
    `layer_types`: one name of the layer-type table (LAYER_TYPES) per layer; None: every layer
    "full_attention" (grouped-query), or the default of Kimi Linear's options (`default_layer_types`):
    `mla` (`attnres.model.attention_config.MLAConfig`), the options of "latent_attention" layers,
    makes every softmax-attention layer latent, and `kda` (`KDAConfig`), those of "linear_attention"
    (Kimi Delta Attention), gives every 4th layer softmax attention and the rest linear.
    `mixer_options`: {layer type: its options} for a registered layer type with options of its own.
    `head_dim=None` means hidden_size // num_heads. `qk_norm` (per-head RMSNorm on queries and
    keys) is Qwen3's; Llama and Mistral have none. `attention_bias` adds q/k/v biases (Qwen2).
    How routing is computed (the routing implementation and chunk size) is not part of the model:
    it is a run setting (`TrainConfig.routing_impl`) or `AttnResLM.set_routing` on a loaded model.
    """

    # The one table of fields: each one's Hugging Face name, default and type there (`hf_field`) sit
    # beside it, and AttnResConfig's fields are generated from them.
    vocab_size: int | str = hf_field(hf_default=32000, hf_type="int")
    hidden_size: int = hf_field(hf_default=512)
    num_layers: int = hf_field("num_hidden_layers", hf_default=8)
    num_heads: int = hf_field("num_attention_heads", hf_default=8)
    num_kv_heads: int = hf_field("num_key_value_heads", hf_default=8)
    head_dim: int | None = None
    intermediate_size: int = hf_field(hf_default=1536)
    moe: MoEConfig | dict | None = hf_field(default=None, hf_type="dict | None")
    mla: MLAConfig | dict | None = hf_field(default=None, hf_type="dict | None")
    kda: KDAConfig | dict | None = hf_field(default=None, hf_type="dict | None")
    layer_types: tuple[str, ...] | list | None = hf_field(default=None, hf_type="list[str] | None")
    mixer_options: dict | None = hf_field(default=None, hf_type="dict | None")
    residual: str = "standard"
    residual_options: VariantOptions | dict | None = hf_field(default=None, hf_type="dict | None")
    tie_embeddings: bool = hf_field("tie_word_embeddings", default=True)
    qk_norm: bool = True
    attention_bias: bool = False
    rope_theta: float = hf_field("attnres_rope_theta", default=1_000_000.0)
    norm_eps: float = hf_field("rms_norm_eps", default=1e-6)
    max_seq_len: int = hf_field("max_position_embeddings", default=2048)
    init_std: float = hf_field("initializer_range", default=0.02)

    def __post_init__(self) -> None:
        if self.vocab_size != AUTO_VOCAB:
            check_int(self.vocab_size, "ModelConfig.vocab_size", error=ConfigError,
                      why=f", or {AUTO_VOCAB!r} until a run's tokenizer is read")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_seq_len"):
            check_int(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        if self.num_layers > MAX_LAYERS:  # checking the residual scheme builds one router per sub-layer
            raise ConfigError(f"ModelConfig.num_layers must be at most {MAX_LAYERS}, got {self.num_layers}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"ModelConfig.head_dim: hidden_size={self.hidden_size} is not divisible by "
                    f"num_heads={self.num_heads}; give head_dim explicitly (a positive even integer)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        check_int(self.head_dim, "ModelConfig.head_dim", error=ConfigError)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_kv_heads must divide num_heads={self.num_heads}; allowed values: "
                f"{divisors_hint(self.num_heads)}, got {self.num_kv_heads}")
        for name in ("rope_theta", "norm_eps", "init_std"):
            check_positive_number(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        for name in ("tie_embeddings", "qk_norm", "attention_bias"):
            check_bool(getattr(self, name), f"ModelConfig.{name}", error=ConfigError)
        self._check_sublayers()
        options = resolve_options(self.residual, self.residual_options, self.num_layers, prefix="ModelConfig.",
                                  error=ConfigError)
        object.__setattr__(self, "residual_options", options)

    def _check_sublayers(self) -> None:
        """Each sub-layer row's options typed (its own field, or `mixer_options`), the layer types
        resolved, and the rows in use (or given options) checked."""
        for row in [*TOKEN_MIXERS.values(), *FEED_FORWARDS.values()]:
            if row.config_field is not None and getattr(self, row.config_field) is not None:
                object.__setattr__(self, row.config_field, self._typed(row, getattr(self, row.config_field),
                                                                       row.config_field))
        self._check_mixer_options()
        self._check_layer_types()
        mixers = {self.layer_type(i) for i in range(self.num_layers)}
        for name in sorted(mixers):
            row = TOKEN_MIXERS[name]
            if row.options is not None and self.sublayer_options(name) is None:
                where = row.config_field or f"mixer_options[{name!r}]"
                raise ConfigError(f"ModelConfig.layer_types has {name!r} layers but ModelConfig.{where} is None; "
                                  f"give {where} or use other layer types")
        feed_forwards = {feed_forward_type(self, i) for i in range(self.num_layers)}
        for table, used in ((TOKEN_MIXERS, mixers), (FEED_FORWARDS, feed_forwards)):
            for row in table.values():
                given = row.config_field is not None and getattr(self, row.config_field) is not None
                problem = row.check(self) if row.check is not None and (row.name in used or given) else None
                if problem:
                    raise ConfigError(problem)

    @staticmethod
    def _typed(row, value, where: str):
        try:
            return row.options.from_dict(value)
        except InputError as error:
            raise ConfigError(f"ModelConfig.{where}: {error}") from None

    def _check_mixer_options(self) -> None:
        if self.mixer_options is None:
            return
        own = [name for name, row in TOKEN_MIXERS.items() if row.options is not None and row.config_field is None]
        if not isinstance(self.mixer_options, dict) or any(name not in own for name in self.mixer_options):
            raise ConfigError(f"ModelConfig.mixer_options must be None or a mapping of layer types with options "
                              f"of their own ({own}) to those options, got {self.mixer_options!r}")
        object.__setattr__(self, "mixer_options", {
            name: self._typed(TOKEN_MIXERS[name], value, f"mixer_options[{name!r}]")
            for name, value in self.mixer_options.items()})

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            if self.kda is not None or self.mla is not None:
                object.__setattr__(self, "layer_types", default_layer_types(
                    self.num_layers, linear=self.kda is not None, latent=self.mla is not None))
            return
        types = self.layer_types
        if not isinstance(types, (list, tuple)) or len(types) != self.num_layers or any(
                not isinstance(t, str) or t not in LAYER_TYPES for t in types):
            raise ConfigError(f"ModelConfig.layer_types must be None or a list of num_layers={self.num_layers} values "
                              f"from {list(LAYER_TYPES)}, got {types!r}")
        if self.mla is not None and "full_attention" in types:  # 0.2.0: with mla, these were latent
            types = compat.latent_layer_types(types)
        if all(LAYER_TYPES[t].cache_state != KV_STATE for t in types):
            keeping = [name for name, row in LAYER_TYPES.items() if row.cache_state == KV_STATE]
            raise ConfigError(f"ModelConfig.layer_types needs at least one layer that caches keys and values "
                              f"({keeping}): caches (attnres's and transformers') count the positions seen in them")
        object.__setattr__(self, "layer_types", tuple(types))

    def sublayer_options(self, name: str):
        """The options of layer type `name` (its own field, or `mixer_options[name]`); None where not given."""
        row = TOKEN_MIXERS[name]
        if row.config_field is not None:
            return getattr(self, row.config_field)
        return (self.mixer_options or {}).get(name)

    def layer_type(self, index: int) -> str:
        """Layer `index`'s token mixer: a name of LAYER_TYPES ("full_attention", "linear_attention", ...)."""
        return "full_attention" if self.layer_types is None else self.layer_types[index]

    def with_vocab_size(self, vocab_size: int) -> "ModelConfig":
        """This config with an unresolved vocabulary (`AUTO_VOCAB`) resolved to `vocab_size` (a
        tokenizer's); a stated one is kept. The other fields are not checked again."""
        if self.vocab_size != AUTO_VOCAB:
            return self
        check_int(vocab_size, "vocab_size", error=ConfigError)
        resolved = copy.copy(self)
        object.__setattr__(resolved, "vocab_size", vocab_size)
        return resolved

    @property
    def num_sublayers(self) -> int:
        """2L: attention and MLP sub-layers alternate, attention first."""
        return 2 * self.num_layers

    @property
    def variant(self) -> str:
        """The variant's display name: its residual and the options that differ from their defaults."""
        return variant_label(self.residual, self.residual_options)

    def to_dict(self) -> dict:
        """Plain dict of every field, the options as a dict (round-trips through `ModelConfig(**d)`); lists,
        not tuples, so YAML and JSON write it as they read it."""
        values = asdict(self)
        if values["layer_types"] is not None:
            values["layer_types"] = list(values["layer_types"])
        return values

    def to_hf_dict(self) -> dict:
        """The fields under Hugging Face's names: a `config.json` for `AttnResForCausalLM`."""
        values, names = self.to_dict(), hf_names(type(self))
        renamed = {names.get(name, name): value for name, value in values.items()}
        return {"model_type": "attnres", "architectures": ["AttnResForCausalLM"], **renamed}

    @classmethod
    def from_hf_dict(cls, values: dict) -> "ModelConfig":
        """Inverse of `to_hf_dict` (other keys of a config.json are ignored); a config.json written
        before the options were typed loads too (`attnres.residual.legacy`)."""
        if not isinstance(values, dict):
            raise ConfigError(f"config.json must hold a JSON object of model fields, got {type(values).__name__}")
        ours, names = {f.name for f in fields(cls)}, hf_names(cls)
        back = {hf: name for name, hf in names.items()}
        values, _ = upgrade_model_fields({back.get(key, key): value for key, value in values.items()},
                                         prefix="config.json: ", error=ConfigError)
        return cls._with_required({key: value for key, value in values.items() if key in ours}, "config.json",
                                  names)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """Build from a dict (a YAML `model:` section), rejecting unknown keys by name. The variant's
        options may also be written at the top level (`num_blocks: 4`); fields written before the
        options were typed are translated (`attnres.residual.legacy`; run settings are dropped)."""
        if not isinstance(values, dict):
            raise ConfigError(f"ModelConfig must be built from a mapping of its fields, got {type(values).__name__}")
        values, _ = upgrade_model_fields(values, flat_options=True, prefix="ModelConfig.", error=ConfigError)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known, key=str)
        if unknown:
            residual = values.get("residual")
            kind = VARIANTS[residual].options if isinstance(residual, str) and residual in VARIANTS else None
            extra = f"; options of residual={values.get('residual')!r}: {kind.names()}" if kind else ""
            raise ConfigError(f"ModelConfig: unknown field(s) {unknown}; allowed fields: {sorted(known)}{extra}")
        return cls._with_required(values, "ModelConfig")

    @classmethod
    def _with_required(cls, values: dict, where: str, names: dict | None = None) -> "ModelConfig":
        """cls(**values), or ConfigError naming the required fields `values` lacks (under `names`' spelling)."""
        names = names or {}
        required = required_fields(cls)
        missing = [names.get(name, name) for name in required if name not in values]
        if missing:
            raise ConfigError(f"{where}: missing field(s) {missing}; required fields: "
                              f"{[names.get(name, name) for name in required]}")
        return cls(**values)


# ModelConfig field -> the name transformers' configs and generation utilities use (from `hf_field`).
HF_NAMES = hf_names(ModelConfig)
