"""What makes a directory load with transformers, beside its weights: config.json with the special-token
ids, generation_config.json and the tokenizer.

Shared by training checkpoints (`hf_directory_files`) and `attnres convert` (`attnres.hf.export`), so
both carry the same special tokens and generation defaults: `AutoTokenizer.from_pretrained(dir)` and
`model.generate(...)` then stop at the end-of-sequence token the way the source model does.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from attnres.common.json_files import JSONFileError, read_json_object
from attnres.data import Tokenizer
from attnres.model import ModelConfig

SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"


def special_token_ids(values: dict) -> dict:
    """{"bos_token_id", "eos_token_id", "pad_token_id"} of a config dict; None where it has none.

    eos_token_id may be a list (models that stop at any of several tokens)."""
    return {key: values.get(key) for key in SPECIAL_TOKEN_IDS}


def generation_defaults(token_ids: dict, source: dict | None = None) -> dict:
    """The fields of generation_config.json: every field of the source model's (eos lists, sampling
    defaults) where it has one, with the special-token ids filled in where the source lacks them."""
    values = dict(source or {})
    for key, value in token_ids.items():
        if values.get(key) is None and value is not None:
            values[key] = value
    return values


def read_generation_config(directory: str | Path) -> dict | None:
    """A model directory's generation_config.json as a dict; None when it has none or it is not an object."""
    try:
        return read_json_object(Path(directory) / GENERATION_CONFIG_FILE, GENERATION_CONFIG_FILE)
    except JSONFileError:
        return None


def hf_directory_files(config: ModelConfig, tokenizer: Tokenizer, generation_source: dict | None = None
                       ) -> dict[str, bytes]:
    """{file name: content} that, beside model.safetensors, make a directory an attnres model that
    transformers loads (`import attnres.hf`): config.json (with the tokenizer's special-token ids),
    generation_config.json (`generation_defaults`) and the tokenizer's files."""
    ids = tokenizer.special_token_ids()
    files = {CONFIG_FILE: _json_bytes({**config.to_hf_dict(), **ids}),
             GENERATION_CONFIG_FILE: _json_bytes(generation_defaults(ids, generation_source))}
    with tempfile.TemporaryDirectory() as directory:
        for path in sorted(tokenizer.save(directory).iterdir()):
            files[path.name] = path.read_bytes()
    return files


def _json_bytes(values: dict) -> bytes:
    return (json.dumps(values, indent=1) + "\n").encode("utf-8")
