"""A Hugging Face-format attnres directory (`attnres convert` output, or a training checkpoint), checked
before a command loads it (`load_model_dir`): config.json, the weight files' headers and the tokenizer,
each refused in one line that names the file and what would work (transformers' own errors are tracebacks)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError

from attnres.checkpoint.weights import header_shapes, pickle_shapes, weights_misfit
from attnres.common.errors import InputError
from attnres.common.json_files import CONFIG_FILE, read_json_object
from attnres.hf.convert import TORCH_FILES
from attnres.model import AttnResLM, ModelConfig

WHAT_WORKS = "give a directory written by `attnres convert` or a training checkpoint (runs/X/checkpoints/step_N)"


def check_model_dir(model_dir: str | Path, what: str = "MODEL") -> dict:
    """config.json's values of the attnres model directory `model_dir`; InputError (naming it as `what`,
    the command's argument) for a config.json that is missing or not a JSON object (`read_json_object`'s
    JSONFileError), of another model type or with invalid fields, no weight file, or a safetensors file whose
    header does not parse or whose data does not cover the file (corrupt, truncated), and weights that
    are not exactly the model's: a missing, unexpected or mis-shaped tensor (`_check_weights_fit`). Reads
    the headers only, not the weights."""
    path = Path(model_dir)
    name = f"{what} {str(path)!r}"
    values = read_json_object(path / CONFIG_FILE, name, hint=WHAT_WORKS)
    model_type = values.get("model_type")
    if model_type != "attnres":
        raise InputError(f"{name} holds a {model_type!r} model, not an attnres one; convert it first: "
                         f"attnres convert {path} --out DIR")
    try:
        config = ModelConfig.from_hf_dict(values)
    except InputError as error:
        raise InputError(f"{name}: config.json: {error}") from None
    weights = sorted(p for p in path.glob("*.safetensors") if p.name != "trainer.safetensors")
    if not weights and not any((path / file).is_file() for file in TORCH_FILES):
        raise InputError(f"{name} has no weights (model.safetensors); {WHAT_WORKS}")
    _check_weights_fit(path, name, config, weights)
    return values


def _check_weights_fit(path: Path, name: str, config: ModelConfig, weights: list[Path]) -> None:
    """InputError naming every missing, unexpected or mis-shaped tensor of the directory's weight files
    against the model its config.json describes (`weights_misfit`, the check `analyze` and `finetune`
    make), read from the headers: transformers would fill a missing tensor randomly and go on."""
    shapes = {}
    for file in weights:
        try:
            shapes.update(header_shapes([file]))
        except (SafetensorError, OSError) as error:
            raise InputError(f"{name}: {file.name} is corrupt or truncated ({error}); convert the model "
                             f"again, or take another checkpoint") from None
    if not weights:  # pytorch_model.bin, or the shards its index names
        index = path / TORCH_FILES[1]
        files = [path / TORCH_FILES[0]] if (path / TORCH_FILES[0]).is_file() else [
            path / shard for shard in sorted(set(_bin_index_shards(index, name)))]
        try:
            shapes = pickle_shapes(files)
        except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError, TypeError, KeyError,
                AttributeError, IndexError) as error:  # torch.load's errors for a damaged pickle
            problem = " ".join(str(error).split())
            raise InputError(f"{name}: its pytorch_model.bin weights cannot be read ({problem}); convert the model "
                             f"again, or take another checkpoint") from None
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = AttnResLM(config)
    misfit, _ = weights_misfit(model, shapes)
    if misfit:
        raise InputError(f"{name}: its weights do not fit the model its config.json describes: {misfit}; "
                         f"convert the model again, or take another checkpoint")


def _bin_index_shards(index: Path, name: str) -> list[str]:
    """The shard files pytorch_model.bin.index.json names (its weight_map's values)."""
    values = read_json_object(index, name, hint=WHAT_WORKS)
    weight_map = values.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"{name}: {index.name} has no weight_map of tensor names to shard files; {WHAT_WORKS}")
    missing = sorted({shard for shard in weight_map.values() if not (index.parent / shard).is_file()})
    if missing:
        raise InputError(f"{name}: {index.name} names shards that are not there: {', '.join(missing)}")
    return list(weight_map.values())


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


def load_model_dir(model_dir, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(AttnResForCausalLM in eval mode on `device` with its weights in `dtype`, its tokenizer) from a
    directory written by `attnres convert` or a training checkpoint; InputError saying what is missing
    otherwise."""
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    check_model_dir(path)  # config.json, the weights' headers: one line each, not transformers' tracebacks
    tokenizer = load_tokenizer(path, padding_side="left")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, SafetensorError) as error:
        raise InputError(f"MODEL {str(path)!r}: its weights could not be loaded ({error})") from None
    return model.to(device).eval(), tokenizer
