"""The table of layer types: which token mixer (attnres.model.sublayer_protocols.TokenMixer) each name
of `ModelConfig.layer_types` builds, with its options. The built-in rows are registered here, so the
table is complete wherever it is imported:

- "full_attention": grouped-query attention (attnres.model.attention);
- "latent_attention": multi-head latent attention (attnres.model.mla), options `MLAConfig` in
  `ModelConfig.mla`; Kimi Linear's config.json calls these layers "full_attention", and conversion
  maps them here;
- "linear_attention": Kimi Delta Attention (attnres.model.kda), options `KDAConfig` in `ModelConfig.kda`.

`register_token_mixer` adds a row; a mixer with options of its own names their class, and
`ModelConfig.mixer_options[name]` holds them (docs/how-to/add-a-method.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnres.common.errors import InputError
from attnres.common.registry import Registry
from attnres.model.attention import Attention
from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.kda import KimiDeltaAttention
from attnres.model.mla import LatentAttention
from attnres.model.sublayer_protocols import CACHE_STATES, KV_STATE, RECURRENT_STATE, TokenMixer


@dataclass(frozen=True)
class TokenMixerType:
    """A row of the layer-type table.

    name:         the layer type, as `ModelConfig.layer_types` and a config.json spell it.
    build:        (config, layer index) -> the layer's TokenMixer, reading its options from the config.
    cache_state:  the `cache_state` of the mixers it builds (checked when one is built), stated here
                  so that ModelConfig can check a layer pattern without building it: a model needs at
                  least one layer that caches keys and values, whose cache tells the sequence length.
    options:      the class of its options (a frozen dataclass with `from_dict(values)`), or None. A
                  model with such layers must give them: in `ModelConfig.mixer_options[name]`, or in
                  the ModelConfig field `config_field` (Kimi Linear's `mla` and `kda`, as its config.json
                  names them).
    check:        (config) -> None, or a message saying why the config cannot hold these layers (an odd
                  head_dim for rotary attention).
    """

    name: str
    build: Callable[..., TokenMixer]
    cache_state: str = KV_STATE
    options: type | None = None
    config_field: str | None = None
    check: Callable[..., str | None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"TokenMixerType.name must be a non-empty string, got {self.name!r}")
        if not callable(self.build) or not (self.check is None or callable(self.check)):
            raise InputError(f"TokenMixerType {self.name!r}: build and check must be callable, got {self.build!r}, "
                             f"{self.check!r}")
        if self.cache_state not in CACHE_STATES:
            raise InputError(f"TokenMixerType {self.name!r}: cache_state must be one of {list(CACHE_STATES)}, "
                             f"got {self.cache_state!r}")
        if self.options is not None and not callable(getattr(self.options, "from_dict", None)):
            raise InputError(f"TokenMixerType {self.name!r}: options must be a class with from_dict(values), "
                             f"got {self.options!r}")
        if self.config_field is not None and self.options is None:
            raise InputError(f"TokenMixerType {self.name!r}: config_field needs options")


TOKEN_MIXERS: Registry[TokenMixerType] = Registry("layer type")


def register_token_mixer(row: TokenMixerType) -> TokenMixerType:
    """Add `row` to the table (a name already there is an error); returns it."""
    return TOKEN_MIXERS.register(row)


def unregister_token_mixer(name: str) -> None:
    """Remove a layer type added with `register_token_mixer` (for tests and experiments)."""
    TOKEN_MIXERS.unregister(name)


def build_token_mixer(config, index: int) -> TokenMixer:
    """Layer `index`'s token mixer for `config` (a ModelConfig), by its layer type's row."""
    row = TOKEN_MIXERS[config.layer_type(index)]
    mixer = row.build(config, index)
    if not isinstance(mixer, TokenMixer) or mixer.cache_state != row.cache_state:
        raise InputError(f"layer type {row.name!r} built {type(mixer).__name__}, which is not a TokenMixer with "
                         f"the row's cache_state {row.cache_state!r}")
    return mixer


def even_head_dim(config) -> str | None:
    """The check of a rotary layer type: RoPE rotates pairs of head_dim channels."""
    if config.head_dim % 2:
        return f"ModelConfig.head_dim must be even (RoPE rotates pairs), got {config.head_dim}"
    return None


register_token_mixer(TokenMixerType("full_attention", lambda config, index: Attention(config), check=even_head_dim))
# The latent norms keep their own eps of 1e-6 (LatentAttention's doc), not norm_eps.
register_token_mixer(TokenMixerType(
    "latent_attention", lambda config, index: LatentAttention(config.hidden_size, config.num_heads, config.mla,
                                                              config.attention_bias),
    options=MLAConfig, config_field="mla"))
register_token_mixer(TokenMixerType(
    "linear_attention", lambda config, index: KimiDeltaAttention(config.hidden_size, config.kda, config.norm_eps),
    cache_state=RECURRENT_STATE, options=KDAConfig, config_field="kda"))

__all__ = ["CACHE_STATES", "KV_STATE", "RECURRENT_STATE", "TOKEN_MIXERS", "TokenMixer", "TokenMixerType",
           "build_token_mixer", "even_head_dim", "register_token_mixer", "unregister_token_mixer"]
