"""GGUF input: transformers reads (and dequantises) a GGUF file; attnres converts the result."""

from __future__ import annotations

from pathlib import Path

import torch

from attnres.hf.errors import ConversionError


def _split(path: str | Path) -> tuple[str, str]:
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"GGUF file {path} does not exist")
    return str(path.parent), path.name


def read_gguf_config(path: str | Path) -> dict:
    """The Hugging Face config dict (model_type llama, qwen2, ...) described by a GGUF file's metadata."""
    from transformers import AutoConfig

    directory, name = _split(path)
    return AutoConfig.from_pretrained(directory, gguf_file=name).to_dict()


def read_gguf_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The dequantised fp32 state dict, under Hugging Face names (model.layers.0.self_attn.q_proj.weight, ...)."""
    from transformers import AutoModelForCausalLM

    directory, name = _split(path)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    return dict(model.state_dict())


def save_gguf_tokenizer(path: str | Path, out_dir: str | Path) -> None:
    """Save the tokenizer embedded in a GGUF file as a Hugging Face tokenizer directory."""
    from transformers import AutoTokenizer

    directory, name = _split(path)
    AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(str(out_dir))
