"""Wrap an AttnResLM as AttnResForCausalLM and save it in Hugging Face format; `attnres convert` end to end."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig

from attnres.checkpoint.hf_dir import generation_defaults, read_generation_config, special_token_ids
from attnres.common.atomic import publish
from attnres.common.deprecation import merge_old_option_keywords
from attnres.data.tiktoken_files import check_tiktoken_source
from attnres.data.tokenizer import copy_tokenizer_files
from attnres.hf.configuration import AttnResConfig
from attnres.hf.convert import ConversionError, convert_checkpoint, read_source_config
from attnres.hf.modeling import AttnResForCausalLM
from attnres.model import AttnResLM


def to_hf_model(model: AttnResLM, token_ids: dict | None = None, generation: dict | None = None
                ) -> AttnResForCausalLM:
    """An AttnResForCausalLM holding `model` itself (no copy of the weights).

    token_ids: bos/eos/pad ids for its config (`special_token_ids`); generation: a source model's
    generation_config.json fields (`generation_defaults` fills in the ids)."""
    ids = {key: value for key, value in (token_ids or {}).items() if value is not None}
    wrapper = AttnResForCausalLM(AttnResConfig.from_model_config(model.config, **ids))
    wrapper.model = model
    wrapper.generation_config = GenerationConfig.from_dict(generation_defaults(ids, generation))
    return wrapper.eval()


def check_new_dir(out_dir: str | Path) -> Path:
    """`out_dir` as a Path; ConversionError when it exists and is not an empty directory (nothing is overwritten)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConversionError(f"output directory {str(out)!r} already exists and is not empty; choose another "
                              f"--out or delete it")
    return out


def save_hf(model: AttnResLM, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
            token_ids: dict | None = None, generation: dict | None = None) -> Path:
    """save_pretrained (model.safetensors, config.json, generation_config.json) plus the tokenizer
    files of tokenizer_dir (`TOKENIZER_FILES`, chat template included) into out_dir; returns it.

    The directory is built beside out_dir (`.NAME.PID.*.tmp`) and renamed into place, so out_dir holds a
    whole model or nothing; an out_dir that exists and is not empty is refused (nothing is overwritten).
    What a killed conversion into out_dir left beside it (its process gone) is removed first.
    token_ids and generation as in `to_hf_model`."""
    return build_hf_dir(out_dir, lambda tmp: to_hf_model(model, token_ids, generation).save_pretrained(tmp),
                        tokenizer_dir)


def build_hf_dir(out_dir: str | Path, write_model, tokenizer_dir: str | Path | None = None) -> Path:
    """`save_hf`'s directory handling with the model written by `write_model(tmp)` (weights, config.json,
    generation_config.json) and the tokenizer files of tokenizer_dir copied beside it: built in a
    temporary directory beside out_dir and renamed into place; returns out_dir."""
    out = check_new_dir(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_killed_builds(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp", dir=out.parent))
    try:
        write_model(tmp)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _remove_killed_builds(out: Path) -> None:
    """Delete the temporary directories `save_hf` builds beside `out` whose process no longer runs: a
    killed conversion's half-built model (as large as the model) would otherwise stay there, hidden."""
    for path in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        parts = path.name[len(out.name) + 2:].split(".")  # PID, mkdtemp's random part, "tmp"
        if len(parts) == 3 and parts[0].isdigit() and not _running(int(parts[0])):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def convert_to_hf(source: str | Path, out_dir: str | Path, residual: str = "standard",
                  residual_options: dict | None = None, dtype: torch.dtype = torch.float32,
                  max_seq_len: int | None = None, **deprecated) -> tuple[Path, AttnResLM]:
    """Convert a Hugging Face checkpoint directory or a .gguf file (`convert_checkpoint`) and save it
    with `save_hf`, keeping what generation needs from the source: its special-token ids (config.json),
    its generation defaults (generation_config.json, eos lists included; for a GGUF file, those
    transformers derives from its metadata) and its tokenizer (copied, or the GGUF's embedded one
    saved), chat template included. Returns (out_dir, the converted model). (`num_blocks=` and
    `exact_conversion=`, 0.1.0's keywords, still work with a DeprecationWarning until 0.3.0.)"""
    residual_options = merge_old_option_keywords("convert_to_hf", residual_options, deprecated,
                                                 error=ConversionError)
    check_new_dir(out_dir)  # now, not after the conversion
    check_tiktoken_source(source)  # so is a tiktoken tokenizer that cannot be rebuilt
    source_config = read_source_config(source)  # once: a GGUF file's metadata takes seconds to read
    ids = special_token_ids(source_config)

    def convert() -> AttnResLM:
        return convert_checkpoint(source, residual=residual, residual_options=residual_options, dtype=dtype,
                                  max_seq_len=max_seq_len, source_config=source_config)

    if str(source).endswith(".gguf"):
        from attnres.hf.gguf import save_gguf_tokenizer

        with tempfile.TemporaryDirectory() as tokenizer_dir:
            save_gguf_tokenizer(source, tokenizer_dir)  # first: a GGUF without a tokenizer is refused before its weights
            model = convert()
            out = save_hf(model, out_dir, tokenizer_dir, ids)
    else:
        model = convert()
        out = save_hf(model, out_dir, source, ids, read_generation_config(source))
    return out, model
