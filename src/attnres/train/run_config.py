"""RunConfig: model + data + train settings of one run, from YAML with `key=value` overrides.

`load_run_config` is the one pass from a run file to a typed run: the YAML (over a base), the
translation of an earlier version's model fields (`attnres.residual.legacy`), the `--set` overrides,
then RunConfig, whose `model` is a ModelConfig built once. Its vocabulary may be `AUTO_VOCAB`, not
yet known: the trainer resolves it once, from the tokenizer (`ModelConfig.with_vocab_size`). How the
model is routed is checked here, where the run's settings meet its model.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnres.common.config_files import parse_assignment, read_yaml_mapping
from attnres.common.errors import InputError
from attnres.common.json_files import CONFIG_FILE, read_json_object
from attnres.common.user_paths import user_path_text
from attnres.data import DataConfig
from attnres.model import ModelConfig
from attnres.model.model_config import AUTO_VOCAB
from attnres.residual import check_routing
from attnres.residual.legacy import upgrade_model_fields
from attnres.train.train_config import TrainConfig

AUTO = AUTO_VOCAB
# YAML 1.1 (PyYAML) reads 1e-3 as a string; a number is what anyone writing it means.
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
SECTIONS = ("model", "data", "train")
TOP_LEVEL = (*SECTIONS, "out_dir", "init_from")


class RunConfigError(InputError):
    """A run configuration that cannot be used; the message names the key and what is allowed."""


@dataclass(frozen=True)
class RunConfig:
    """One training run. `model` is a ModelConfig (given as one, or as a mapping of its fields); its
    vocab_size "auto" (the default in a run file) takes the tokenizer's when the run starts. A `model`
    section written before the options were typed is translated (`attnres.residual.legacy`); its
    routing_impl and routing_chunk_size become the train section's defaults.

    init_from: a Hugging Face-format directory (config.json + safetensors: `attnres convert` output
    or a training checkpoint) whose weights start the run; its config supplies every model field
    the `model` section does not set (typically only residual and its options).
    """

    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str = "runs/default"
    init_from: str | None = None

    def __post_init__(self) -> None:
        # out_dir as a shell user means it: ~ expanded, an empty one refused (not read as the working directory)
        object.__setattr__(self, "out_dir", user_path_text(self.out_dir, "out_dir", RunConfigError))
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig.from_dict({"vocab_size": AUTO, **self.model}))
        elif not isinstance(self.model, ModelConfig):
            raise RunConfigError(f"RunConfig.model must be a ModelConfig or a mapping of its fields, "
                                 f"got {self.model!r}")
        model = self.model
        check_routing(model.residual, model.residual_options, model.num_layers, self.train.routing_impl,
                      self.train.routing_chunk_size, prefix="train.", error=RunConfigError)
        if self.train.seq_len > model.max_seq_len:
            raise RunConfigError(f"train.seq_len={self.train.seq_len} is above the model's maximum "
                                 f"model.max_seq_len={model.max_seq_len}; lower seq_len or raise max_seq_len")

    def to_dict(self) -> dict:
        """Plain dict (YAML/JSON-safe) that `RunConfig.from_dict` reads back."""
        return {"out_dir": self.out_dir, "init_from": self.init_from, "model": self.model.to_dict(),
                "data": dataclasses.asdict(self.data), "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Build from {"model": ..., "data": ..., "train": ..., "out_dir": ...}; unknown keys are errors."""
        if not isinstance(values, dict):
            raise RunConfigError(f"a run config must be a mapping with sections {list(SECTIONS)}, got "
                                 f"{type(values).__name__}")
        unknown = sorted(set(values) - set(TOP_LEVEL), key=str)
        if unknown:
            raise RunConfigError(f"unknown top-level key(s) {unknown}; allowed: {sorted(TOP_LEVEL)}")
        init_from = values.get("init_from")
        if "model" not in values and init_from is None:
            raise RunConfigError("the config needs a 'model' section (ModelConfig fields) or init_from")
        data = _section(values, "data", DataConfig)
        if not isinstance(values.get("model") or {}, dict):
            raise RunConfigError(f"'model' must be a mapping of ModelConfig fields, got {values['model']!r}")
        model = {key: yaml_number(value) for key, value in dict(values.get("model") or {}).items()}
        if init_from is not None:
            if not isinstance(init_from, str) or not init_from.strip():
                raise RunConfigError(f"init_from must be the path of a Hugging Face-format attnres directory "
                                     f"(`attnres convert` output or a training checkpoint), got {init_from!r}")
            init_from = user_path_text(init_from, "init_from", RunConfigError)  # ~ as a shell user means it
            pretrained = pretrained_model_fields(init_from)
            if model.get("residual", pretrained["residual"]) != pretrained["residual"]:
                del pretrained["residual_options"]  # another variant: its options are the model section's
            # A nested section (moe, mla, kda, residual_options) is refined field by field, so that
            # --set model.moe.num_experts=8 keeps the rest of the pretrained model's moe section.
            model = {**pretrained, **{key: {**pretrained[key], **value}
                                      if isinstance(value, dict) and isinstance(pretrained.get(key), dict) else value
                                      for key, value in model.items()}}
        model, settings = upgrade_model_fields(model, flat_options=True, prefix="model.", error=RunConfigError)
        train = values.get("train") or {}
        train = _section({"train": {**settings, **train} if isinstance(train, dict) else train}, "train", TrainConfig)
        return cls(model=ModelConfig.from_dict({"vocab_size": AUTO, **model}), data=data, train=train,
                   out_dir=str(values.get("out_dir", "runs/default")),
                   init_from=None if init_from is None else str(init_from))


def finetune_defaults(init_from: str | Path) -> dict:
    """Base run for fine-tuning a converted model: the Delta paper's recipe (base lr 5e-5, routing
    parameters in their own group at 100x, warm-up 500) and the model's own tokenizer."""
    base = {"init_from": str(init_from),
            "train": {"lr": 5e-5, "min_lr": 5e-6, "routing_lr_mult": 100.0, "warmup_steps": 500}}
    if any((Path(init_from) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        base["data"] = {"tokenizer": str(init_from)}
    return base


def load_finetune_config(init_from: str | Path, path: str | Path | None = None,
                         overrides: list[str] = ()) -> RunConfig:
    """The run that fine-tunes the converted model `init_from`: `finetune_defaults`, refined by the YAML
    at `path` and `overrides`. RunConfigError when it would train with a new BPE: a pretrained model
    needs its own tokenizer."""
    base = finetune_defaults(init_from)
    run = load_run_config(path, overrides, base=base)
    if run.data.tokenizer == "bpe":
        if "data" in base:  # the model has one: the config or an override asked for a new BPE
            raise RunConfigError(f"data.tokenizer is 'bpe', but a fine-tuned model must read the tokens it was "
                                 f"trained on: leave data.tokenizer out to use {init_from}'s own tokenizer")
        raise RunConfigError(f"finetune needs the model's own tokenizer and {init_from} has none; "
                             f"pass --set data.tokenizer=DIR")
    return run


def pretrained_model_fields(directory: str | Path) -> dict:
    """ModelConfig fields from `<directory>/config.json` (an attnres Hugging Face config)."""
    path = Path(directory) / CONFIG_FILE
    values = read_json_object(path, "init_from", error=RunConfigError,
                              hint="expected the output of `attnres convert` or a training checkpoint directory")
    if values.get("model_type") != "attnres":
        raise RunConfigError(f"init_from: {path} describes a {values.get('model_type')!r} model; convert it "
                             f"first with `attnres convert`")
    return ModelConfig.from_hf_dict(values).to_dict()


def _section(values: dict, name: str, kind):
    section = values.get(name) or {}
    if not isinstance(section, dict):
        raise RunConfigError(f"'{name}' must be a mapping of {kind.__name__} fields, got {section!r}")
    allowed = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(section) - allowed, key=str)
    if unknown:
        raise RunConfigError(f"unknown {name} key(s) {unknown}; allowed: {sorted(allowed)}")
    return kind(**{key: yaml_number(value) for key, value in section.items()})


def yaml_number(value):
    """`1e-3` as a float (PyYAML leaves exponents without a dot as strings)."""
    return float(value) if isinstance(value, str) and _FLOAT.match(value) else value


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply `section.key=value` strings (value parsed as YAML: 1e-3, true, null, [1, 2]) to a config dict.

    A dotted key sets a field of a nested mapping: `train.pipeline.schedule=gpipe`."""
    if not isinstance(values, dict):
        raise RunConfigError(f"a run config must be a mapping with sections {list(SECTIONS)}, got {values!r}")
    result = {key: (dict(value) if isinstance(value, dict) else value) for key, value in values.items()}
    for item in overrides:
        key, value = parse_assignment(item, "override", "section.key=value (e.g. train.lr=3e-4)", RunConfigError)
        if key == "out_dir":
            result["out_dir"] = str(value)
            continue
        section, dot, name = key.partition(".")
        if not dot or section not in SECTIONS or not name:
            raise RunConfigError(f"override key {key!r} must be out_dir or <section>.<field> with section in "
                                 f"{list(SECTIONS)}")
        target = result.setdefault(section, {})
        if not isinstance(target, dict):
            raise RunConfigError(f"override {key!r}: the config's '{section}' is not a mapping but {target!r}")
        if section == "model":
            _drop_other_spelling(target, name)
        *parents, leaf = name.split(".")
        for parent in parents:  # copied on the way down: the caller's nested mappings stay as they were
            inner = target.get(parent)
            target[parent] = dict(inner) if isinstance(inner, dict) else {}
            target = target[parent]
        target[leaf] = value
    return result


def _drop_other_spelling(model: dict, name: str) -> None:
    """A variant option may be written at the top of `model` or under `residual_options`: an override
    in one spelling replaces the value the other spelling holds, so the override wins."""
    nested = model.get("residual_options")
    if name.startswith("residual_options."):
        model.pop(name.removeprefix("residual_options."), None)
    elif "." not in name and isinstance(nested, dict) and name in nested:
        model["residual_options"] = {key: value for key, value in nested.items() if key != name}


def load_run_config(path: str | Path | None, overrides: list[str] = (), base: dict | None = None) -> RunConfig:
    """The typed run of a YAML run config (or of `base`, which the file refines section by section): its
    model fields in an earlier version's form translated, then `overrides` applied, then RunConfig
    built (module doc)."""
    values = dict(base or {})
    if path is not None:
        loaded = read_yaml_mapping(path, "config file", f"a mapping with sections {list(SECTIONS)}", RunConfigError)
        for key, value in loaded.items():  # a section in the file refines the base's, key by key
            both_sections = isinstance(value, dict) and isinstance(values.get(key), dict)
            values[key] = {**values[key], **value} if both_sections else value
    if isinstance(values.get("model"), dict):  # before the overrides, which are written in today's form
        values["model"], settings = upgrade_model_fields(values["model"], prefix="model.", error=RunConfigError)
        if settings and isinstance(values.get("train") or {}, dict):
            values["train"] = {**settings, **(values.get("train") or {})}
    return RunConfig.from_dict(apply_overrides(values, list(overrides)))
