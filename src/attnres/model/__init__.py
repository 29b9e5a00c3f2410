"""The decoder: config, Qwen3-architecture sub-layers (and Kimi Linear's), token mixers, caches and the language model."""

import importlib

from attnres.common.deprecation import warn_deprecated
from attnres.model.attention_config import KDAConfig, MLAConfig
from attnres.model.cache import KVCache, StaticKVCache
from attnres.model.model_config import RESIDUALS, ConfigError, ModelConfig, valid_num_blocks
from attnres.model.decoder import AttnResLM, CausalLMOutput, next_token_loss
from attnres.model.init_weights import init_module
from attnres.model.moe import MixtureOfExperts
from attnres.model.moe_config import MoEConfig

__all__ = ["RESIDUALS", "AttnResLM", "KVCache", "CausalLMOutput", "ConfigError", "KDAConfig", "MLAConfig",
           "MixtureOfExperts", "ModelConfig", "MoEConfig", "StaticKVCache", "init_module", "next_token_loss",
           "valid_num_blocks"]

# Fast generation moved to attnres.generation (0.3.0), which sits above the model; the old names
# import from there with a warning until 0.4.0.
_MOVED_TO_GENERATION = ("FastGenerator", "GenerationResult", "Sampling")


def __getattr__(name: str):
    if name in _MOVED_TO_GENERATION:
        warn_deprecated(f"attnres.model.{name}", f"attnres.generation.{name}", since="0.3.0")
        return getattr(importlib.import_module("attnres.generation"), name)
    raise AttributeError(f"module 'attnres.model' has no attribute {name!r}")
