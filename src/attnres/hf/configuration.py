"""AttnResConfig: the Hugging Face config of an attnres model (`model_type = "attnres"`).

Its model fields are not written here: they are generated from `ModelConfig`'s dataclass fields,
under the names transformers' configs and generation utilities use (num_hidden_layers, rms_norm_eps,
...), with the defaults and JSON types declared beside each field (`attnres.model.model_config.hf_field`).
A field added to ModelConfig, or to a subclass of it, is therefore a field here with no edit to this
package; `to_model_config()` gives the attnres ModelConfig back.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from transformers import PreTrainedConfig

from attnres.model import ConfigError, ModelConfig
from attnres.residual.legacy import FLAT_OPTIONS, RUN_SETTINGS


class _ModelFields(PreTrainedConfig):
    """Declares on each subclass (before transformers makes it a dataclass) every field of its
    `model_config_class`: the Hugging Face name, type and default of each. All of them, even those a
    base declares, so that a subclass's new default wins; a field the subclass declares itself is kept."""

    def __init_subclass__(cls, **kwargs) -> None:
        own = inspect.get_annotations(cls)  # the class's own, however the Python version stores them
        generated = {}
        for f in dataclasses.fields(cls.model_config_class):
            name = f.metadata.get("hf", f.name)
            if name in own:
                continue
            generated[name] = f.metadata.get("hf_type", f.type)
            if "hf_default" in f.metadata:
                setattr(cls, name, f.metadata["hf_default"])
            elif f.default is not dataclasses.MISSING:
                setattr(cls, name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(cls, name, dataclasses.field(default_factory=f.default_factory))
            # else: required here too (transformers' dataclass fields are keyword-only)
        # the model's fields first, as in ModelConfig; then the class's own (use_cache, token ids)
        cls.__annotations__ = {**generated, **own}
        super().__init_subclass__(**kwargs)  # transformers makes the class a (keyword-only) dataclass


class AttnResConfig(_ModelFields):
    """Hugging Face config mirroring `attnres.ModelConfig` (validated by building one). The variant's
    options are one mapping, `residual_options`; a config.json written before they were typed (with
    flat option fields and routing_impl) loads as today's (`attnres.residual.legacy`).

    The model fields are ModelConfig's (module doc). For a ModelConfig subclass with fields of its own,
    `AttnResConfig.for_model_config_class(MyConfig)` is the config class holding them too; and
    `from_model_config` picks that class by itself from the config it is given, so a model built from
    a MyConfig saves and loads its fields through save_pretrained / from_pretrained. The class is
    chosen in code, never read from a config.json, so loading a file imports nothing it names; such a
    file is written with model_type "attnres", and AutoConfig reads it as a plain AttnResConfig (its
    extra fields as attributes): load it with the subclass's `from_pretrained`, or pass that config
    to `AttnResForCausalLM.from_pretrained(..., config=...)`.
    """

    model_type = "attnres"
    keys_to_ignore_at_inference = ["past_key_values"]
    model_config_class = ModelConfig  # the ModelConfig class whose fields these are (not a field: unannotated)

    use_cache: bool = True
    # Special tokens (eos may be a list): carried from a converted model's source or a training run's
    # tokenizer, so generate() stops at the end of sequence and pads with the right id.
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        model_config = self.to_model_config()  # raises ConfigError naming the field
        self.head_dim = model_config.head_dim
        self.residual_options = model_config.residual_options.to_dict()  # every option, defaults resolved
        for name in [*FLAT_OPTIONS, *RUN_SETTINGS]:  # a config.json written before the options were typed
            if hasattr(self, name):
                delattr(self, name)

    def validate(self) -> None:
        """transformers' checks of a config, but for its check of `layer_types` against its own list:
        attnres's layer types are its table's, which ModelConfig checks and a registered token mixer
        extends ("latent_attention" is not in transformers' list)."""
        for check in getattr(PreTrainedConfig, "__class_validators__", ()):
            if check.__name__ != "validate_layer_type":
                check(self)

    def to_model_config(self) -> ModelConfig:
        """The attnres ModelConfig (of `model_config_class`) these fields describe."""
        return self.model_config_class.from_hf_dict(self.to_dict())

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs) -> "AttnResConfig":
        """The Hugging Face config of an attnres ModelConfig; for a ModelConfig subclass, an instance of
        `for_model_config_class(type(config))`, so its own fields are kept."""
        if type(config) is not cls.model_config_class:
            cls = cls.for_model_config_class(type(config))
        values = config.to_hf_dict()
        del values["model_type"], values["architectures"]
        return cls(**values, **kwargs)

    @classmethod
    def for_model_config_class(cls, model_config_class: type[ModelConfig]) -> type["AttnResConfig"]:
        """The subclass of this config whose fields are `model_config_class`'s (a ModelConfig subclass):
        its extra fields under their own names (or `hf_field`'s), types and defaults. The same class
        is returned for the same argument."""
        if not (isinstance(model_config_class, type) and issubclass(model_config_class, ModelConfig)):
            raise ConfigError(f"AttnResConfig.for_model_config_class takes ModelConfig or a subclass of it, "
                              f"got {model_config_class!r}")
        return _config_class(cls, model_config_class)


@functools.cache  # one class per pair: configs of one ModelConfig class share their class
def _config_class(base: type[AttnResConfig], model_config_class: type[ModelConfig]) -> type[AttnResConfig]:
    if model_config_class is base.model_config_class:
        return base
    namespace = {"model_config_class": model_config_class, "__module__": model_config_class.__module__,
                 "__doc__": f"{base.__name__} with the fields of {model_config_class.__qualname__}."}
    return type(f"{base.__name__}For{model_config_class.__name__}", (base,), namespace)
