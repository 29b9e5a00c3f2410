"""The decoder: config, Qwen3-architecture sub-layers, and the language model."""

from attnres.model.cache import KVCache
from attnres.model.config import RESIDUALS, ConfigError, ModelConfig, valid_num_blocks
from attnres.model.decoder import AttnResLM, CausalLMOutput, next_token_loss

__all__ = ["RESIDUALS", "AttnResLM", "KVCache", "CausalLMOutput", "ConfigError", "ModelConfig", "next_token_loss",
           "valid_num_blocks"]
