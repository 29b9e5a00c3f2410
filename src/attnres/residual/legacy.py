"""The one translation from model configs written before variant options were typed.

In attnres 0.1.0 (December 2026) a variant's options were flat ModelConfig fields, and two run
settings were stored with the model. Checkpoints, converted directories, YAML files and result
files written then still load: `upgrade_model_fields` moves each old field into the variant's
`residual_options` under its new name, drops a field that holds the value that meant "not set",
and hands the run settings back separately (`routing_impl`, `routing_chunk_size`: a run uses them
as its defaults; a loaded model ignores them). A field set to anything else for a variant without
that option is an error naming the field and the variants that take it. In 0.2.0 a model with `mla`
called its latent attention layers "full_attention"; they read as "latent_attention".
"""

from __future__ import annotations

from attnres.common.errors import InputError
from attnres.residual.old_names import FLAT_OPTIONS, RUN_SETTINGS
from attnres.residual.variants import variants_with_option
from attnres.methods import VARIANTS

__all__ = ["FLAT_OPTIONS", "RUN_SETTINGS", "upgrade_model_fields"]


def upgrade_model_fields(values: dict, *, flat_options: bool = False, prefix: str = "",
                         error: type[Exception] = InputError) -> tuple[dict, dict]:
    """(model fields in today's form, the run settings they carried) from model fields of any version.

    flat_options: also accept today's option names at the top level (a YAML `model:` section may
    write `num_blocks: 4` for `residual_options: {num_blocks: 4}`). Values that are not old fields
    pass through unchanged; an unknown residual is left for the config to report.
    """
    values = dict(values)
    if values.get("mla") is not None and isinstance(values.get("layer_types"), (list, tuple)):
        values["layer_types"] = ["latent_attention" if t == "full_attention" else t for t in values["layer_types"]]
    settings = {name: values.pop(name) for name in RUN_SETTINGS if name in values}
    settings = {name: value for name, value in settings.items() if value != RUN_SETTINGS[name]}
    residual = values.get("residual", "standard")
    if not isinstance(residual, str) or residual not in VARIANTS:
        return values, settings
    names = VARIANTS[residual].options.names()
    nested = values.get("residual_options")
    if hasattr(nested, "to_dict"):  # an options object
        nested = nested.to_dict()
    options = dict(nested) if isinstance(nested, dict) else {}
    moved = {}
    for old, (new, unset) in FLAT_OPTIONS.items():
        if old in values:
            moved[old] = (new, values.pop(old), unset)
    if flat_options:
        for name in [key for key in values if key in names]:
            moved[name] = (name, values.pop(name), None)
    for old, (new, value, unset) in moved.items():
        if value is None or (value == unset and new not in names):
            continue
        if new not in names:
            raise error(f"{prefix}{old} applies only to residual in {variants_with_option(new)}; leave it unset "
                        f"for residual={residual!r} (got {value!r})")
        if new in options and options[new] != value:
            raise error(f"{prefix}{old}={value!r} contradicts {prefix}residual_options.{new}={options[new]!r}")
        options[new] = value
    if options or isinstance(nested, dict):
        values["residual_options"] = options
    return values, settings
