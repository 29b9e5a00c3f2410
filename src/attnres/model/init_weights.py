"""The one initialisation of attnres models, used by AttnResLM and by the Hugging Face classes."""

from __future__ import annotations

from torch import nn

from attnres.methods import DepthMixer
from attnres.model.sublayer_protocols import FeedForward
from attnres.norm import RMSNorm


def init_module(module: nn.Module, std: float) -> None:
    """Initialise `module`'s own parameters: linear and embedding weights N(0, std) and biases 0 (as transformers
    initialises Qwen3/Llama), a feed-forward's own parameters by its `reset_parameters(std)` (a mixture of
    experts' router and experts N(0, std), its score bias 0), norm gains 1, depth mixers by their method's rule
    (method §2: zero queries, unit key gains, zero gates), convolutions by PyTorch's default, and a module that
    declares `own_init` (a token mixer, Kimi Delta Attention's forget gate: attnres.model.sublayer_protocols) by
    its `reset_parameters()`. Other modules are left alone."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (RMSNorm, DepthMixer, nn.Conv1d)) or getattr(module, "own_init", False):
        module.reset_parameters()  # RMSNorm: also the gated one
    elif isinstance(module, FeedForward):
        module.reset_parameters(std)
