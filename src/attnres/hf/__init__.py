"""Hugging Face integration: config and model classes, registered with the Auto classes on import."""

try:
    from transformers import AutoConfig, AutoModelForCausalLM
except ModuleNotFoundError as error:  # an optional dependency: name the extra that brings it
    raise ModuleNotFoundError(f"attnres.hf needs {error.name}: pip install 'attnres[hf]'", name=error.name) from error

from attnres.hf.configuration import AttnResConfig
from attnres.hf.convert import ConversionError, convert_checkpoint
from attnres.hf.export import save_hf, to_hf_model
from attnres.hf.modeling import AttnResForCausalLM

AutoConfig.register("attnres", AttnResConfig, exist_ok=True)
AutoModelForCausalLM.register(AttnResConfig, AttnResForCausalLM, exist_ok=True)

__all__ = ["AttnResConfig", "AttnResForCausalLM", "ConversionError", "convert_checkpoint", "save_hf", "to_hf_model"]
