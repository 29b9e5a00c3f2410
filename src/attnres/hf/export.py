"""Wrap an AttnResLM as AttnResForCausalLM and save it in Hugging Face format."""

from __future__ import annotations

import shutil
from pathlib import Path

from attnres.hf.configuration import AttnResConfig
from attnres.hf.modeling import AttnResForCausalLM
from attnres.model import AttnResLM

# Tokenizer files copied from a converted checkpoint, so the output directory is self-contained.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json")


def to_hf_model(model: AttnResLM) -> AttnResForCausalLM:
    """An AttnResForCausalLM holding `model` itself (no copy of the weights)."""
    wrapper = AttnResForCausalLM(AttnResConfig.from_model_config(model.config))
    wrapper.model = model
    return wrapper.eval()


def save_hf(model: AttnResLM, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """save_pretrained (safetensors + config.json) into out_dir, plus tokenizer files from tokenizer_dir."""
    out = Path(out_dir)
    to_hf_model(model).save_pretrained(out)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.is_file():
                shutil.copy2(source, out / name)
    return out
