"""A Hugging Face-format attnres directory (`attnres convert` output, or a training checkpoint), checked
before a command loads it: config.json, the weight files' headers and the tokenizer, each refused in
one line that names the file and what would work (transformers' own errors for these are tracebacks)."""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open

from attnres.common.errors import InputError
from attnres.common.json_files import CONFIG_FILE, read_json_object
from attnres.model import ModelConfig

WHAT_WORKS = "give a directory written by `attnres convert` or a training checkpoint (runs/X/checkpoints/step_N)"
BIN_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def check_model_dir(model_dir: str | Path, what: str = "MODEL") -> dict:
    """config.json's values of the attnres model directory `model_dir`; InputError (naming it as `what`,
    the command's argument) for a config.json that is missing or not a JSON object (`read_json_object`'s
    JSONFileError), of another model type or with invalid fields, no weight file, or a safetensors file whose
    header does not parse or whose data does not cover the file (corrupt, truncated). Reads the
    headers only, not the weights."""
    path = Path(model_dir)
    name = f"{what} {str(path)!r}"
    values = read_json_object(path / CONFIG_FILE, name, hint=WHAT_WORKS)
    model_type = values.get("model_type")
    if model_type != "attnres":
        raise InputError(f"{name} holds a {model_type!r} model, not an attnres one; convert it first: "
                         f"attnres convert {path} --out DIR")
    try:
        ModelConfig.from_hf_dict(values)
    except InputError as error:
        raise InputError(f"{name}: config.json: {error}") from None
    weights = sorted(p for p in path.glob("*.safetensors") if p.name != "trainer.safetensors")
    if not weights and not any((path / file).is_file() for file in BIN_WEIGHTS):
        raise InputError(f"{name} has no weights (model.safetensors); {WHAT_WORKS}")
    for file in weights:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            raise InputError(f"{name}: {file.name} is corrupt or truncated ({error}); convert the model again, or "
                             f"take another checkpoint") from None
    return values


def load_tokenizer(model_dir: str | Path, what: str = "MODEL", **kwargs):
    """AutoTokenizer.from_pretrained(model_dir, **kwargs); InputError naming `what` when none loads."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, **kwargs)
    except (OSError, ValueError, TypeError) as error:
        problem = " ".join(str(error).split())
        raise InputError(f"{what} {str(model_dir)!r}: no tokenizer could be loaded from it ({problem}); give a "
                         f"directory with its tokenizer files, as `attnres convert` and training checkpoints "
                         f"write them") from None
