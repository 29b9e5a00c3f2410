"""The decoder: config, Qwen3-architecture sub-layers (and Kimi Linear's), token mixers, caches and the language model."""

from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.cache import KVCache, StaticKVCache
from attnres.model.model_config import RESIDUALS, ConfigError, ModelConfig, valid_num_blocks
from attnres.model.decoder import AttnResLM, CausalLMOutput, next_token_loss
from attnres.model.init_weights import init_module
from attnres.model.moe import MixtureOfExperts
from attnres.model.moe_config import MoEConfig
from attnres.model.sublayer_protocols import FeedForward, TokenMixer

__all__ = ["RESIDUALS", "AttnResLM", "KVCache", "CausalLMOutput", "ConfigError", "FeedForward", "KDAConfig",
           "MLAConfig", "MixtureOfExperts", "ModelConfig", "MoEConfig", "StaticKVCache", "TokenMixer", "init_module", "next_token_loss",
           "valid_num_blocks"]
