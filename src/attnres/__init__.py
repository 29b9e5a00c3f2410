"""attnres: depth routing residuals (Attention Residuals, Delta Attention Residuals) for PyTorch."""

from attnres.model import AttnResLM, CausalLMOutput, ConfigError, ModelConfig

__all__ = ["AttnResLM", "CausalLMOutput", "ConfigError", "ModelConfig"]
__version__ = "0.1.0"
