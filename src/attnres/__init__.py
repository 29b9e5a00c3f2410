"""attnres: depth routing residuals (Attention Residuals, Delta Attention Residuals) for PyTorch.

    AttnResLM(ModelConfig(..., residual="block_attnres", residual_options={"num_blocks": 8}))  # the whole decoder
    build_residual("delta_block", num_layers=12, hidden_size=768, num_blocks=4)  # drop-in for your own loop
"""

from attnres.common.errors import InputError
from attnres.model import AttnResLM, CausalLMOutput, ConfigError, ModelConfig
from attnres.residual import ResidualScheme, Variant, VariantOptions, build_residual, option, register_variant
from attnres.methods import DepthMixer

__all__ = ["AttnResLM", "CausalLMOutput", "ConfigError", "DepthMixer", "InputError", "ModelConfig", "ResidualScheme",
           "Variant", "VariantOptions", "build_residual", "option", "register_variant"]
__version__ = "0.3.0"

from attnres import compat  # noqa: E402  (the old spellings of 0.3.0, until 0.4.0)

compat.install()
