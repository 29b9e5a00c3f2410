"""AttnResConfig: the Hugging Face config of an attnres model (`model_type = "attnres"`).

Field names follow transformers' conventions (num_hidden_layers, rms_norm_eps, ...) so that its
generation utilities and caches read them; `to_model_config()` gives the attnres ModelConfig.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

from attnres.model import ModelConfig
from attnres.residual.legacy import FLAT_OPTIONS, RUN_SETTINGS


class AttnResConfig(PreTrainedConfig):
    """Hugging Face config mirroring `attnres.ModelConfig` (validated by building one). The variant's
    options are one mapping, `residual_options`; a config.json written before they were typed (with
    flat option fields and routing_impl) loads as today's (`attnres.residual.legacy`)."""

    model_type = "attnres"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 1536
    # Kimi Linear's options (attnres.model.attention_config, moe_config), each a mapping of its fields;
    # layer_types also tells transformers' DynamicCache which layers keep a linear-attention state.
    moe: dict | None = None
    mla: dict | None = None
    kda: dict | None = None
    layer_types: list[str] | None = None
    residual: str = "standard"
    residual_options: dict | None = None
    tie_word_embeddings: bool = True
    qk_norm: bool = True
    attention_bias: bool = False
    attnres_rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    use_cache: bool = True
    # Special tokens (eos may be a list): carried from a converted model's source or a training run's
    # tokenizer, so generate() stops at the end of sequence and pads with the right id.
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        model_config = self.to_model_config()  # raises ConfigError naming the field
        self.head_dim = model_config.head_dim
        self.residual_options = model_config.residual_options.to_dict()  # every option, defaults resolved
        for name in [*FLAT_OPTIONS, *RUN_SETTINGS]:  # a config.json written before the options were typed
            if hasattr(self, name):
                delattr(self, name)

    def to_model_config(self) -> ModelConfig:
        """The attnres ModelConfig these fields describe."""
        return ModelConfig.from_hf_dict(self.to_dict())

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs) -> "AttnResConfig":
        """The Hugging Face config of an attnres ModelConfig."""
        values = config.to_hf_dict()
        del values["model_type"], values["architectures"]
        return cls(**values, **kwargs)
