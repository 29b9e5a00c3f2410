"""The decoder: config, Qwen3-architecture sub-layers (and Kimi Linear's), the language model, and fast generation."""

from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.cache import KVCache, StaticKVCache
from attnres.model.config import RESIDUALS, ConfigError, ModelConfig, valid_num_blocks
from attnres.model.decoder import AttnResLM, CausalLMOutput, next_token_loss
from attnres.model.generation import FastGenerator, GenerationResult, Sampling
from attnres.model.init import init_module
from attnres.model.moe import MixtureOfExperts
from attnres.model.moe_config import MoEConfig

__all__ = ["RESIDUALS", "AttnResLM", "KVCache", "CausalLMOutput", "ConfigError", "FastGenerator", "GenerationResult",
           "KDAConfig", "MLAConfig", "MixtureOfExperts", "ModelConfig", "MoEConfig", "Sampling", "StaticKVCache", "init_module",
           "next_token_loss", "valid_num_blocks"]
