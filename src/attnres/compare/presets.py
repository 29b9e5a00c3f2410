"""Comparison presets: a base run, the variants to train on it, and the number of seeds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnres.common.checks import check_int
from attnres.common.config_files import bundled_config_dir, bundled_presets, prefixed_overrides, read_preset
from attnres.compare.cost import CostSettings
from attnres.model.config import variant_name
from attnres.residual import VARIANTS
from attnres.residual.legacy import upgrade_model_fields
from attnres.report.names import slug
from attnres.train.run_config import RunConfig, RunConfigError, apply_overrides


# What a variant may set: the residual and its options (model fields; the options under
# residual_options or at the top level) and the router-query initialisation.
VARIANT_MODEL_KEYS = ("residual", "residual_options")
VARIANT_TRAIN_KEYS = ("query_init",)


PRESET_KEYS = ("description", "run", "variants", "seeds", "cost")
COST_PREFIX = "cost."  # an override `cost.repeats=10` sets the cost measurement, not the run


@dataclass(frozen=True)
class ComparePreset:
    """name, description, the base run dict (model without residual), variants, seeds, and the
    settings of the cost measurement after training (`cost:`, `CostSettings`)."""

    name: str
    description: str
    run: dict
    variants: list[dict]
    seeds: int
    cost: CostSettings = CostSettings()


def preset_dir() -> Path:
    """Where the bundled presets live (`configs/compare/` in the repository)."""
    return bundled_config_dir("compare")


def available_presets() -> list[str]:
    """Names of the bundled presets."""
    return bundled_presets("compare")


def load_preset(name_or_path: str, overrides: list[str] = ()) -> ComparePreset:
    """A bundled preset by name, or a preset YAML file by path; `overrides` ("section.key=value") apply
    to its run, those starting with "cost." to its cost settings (e.g. "cost.repeats=10")."""
    path, values = read_preset("compare", name_or_path, PRESET_KEYS,
                               "a mapping with description, run, variants, seeds", RunConfigError)
    changed, run_overrides = prefixed_overrides(overrides, COST_PREFIX, "cost.key=value (e.g. cost.repeats=10)",
                                                RunConfigError)
    run = apply_overrides(values.get("run", {}), run_overrides)
    cost = CostSettings.from_dict(values.get("cost"), f"preset {path}: cost")
    if changed:
        cost = CostSettings.from_dict({**cost.to_dict(), **changed}, "--set cost")
    variants = values.get("variants") or []
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants) or not any(
            v.get("residual") == "standard" for v in variants):
        raise RunConfigError(f"preset {path}: 'variants' must list residual schemes and include standard")
    seeds = values.get("seeds", 1)
    check_int(seeds, f"preset {path}: seeds", error=RunConfigError)
    for variant in variants:  # validate every variant's run now, before any training starts
        variant_run(run, variant, seed=0, out_dir="unused")
    return ComparePreset(path.stem, values.get("description", ""), run, variants, seeds, cost)


def variant_run(base: dict, variant: dict, seed: int, out_dir: str) -> RunConfig:
    """The RunConfig of one variant and seed: the base run with the variant's residual and options."""
    residual = variant.get("residual")
    kind = VARIANTS.get(residual) if isinstance(residual, str) else None
    for section in ("model", "train"):
        if not isinstance(base.get(section, {}), dict):
            raise RunConfigError(f"run: '{section}' must be a mapping of its fields, got {base[section]!r}")
    model, _ = upgrade_model_fields({k: v for k, v in variant.items() if k not in VARIANT_TRAIN_KEYS},
                                    flat_options=True, prefix=f"variant {variant}: ", error=RunConfigError)
    unknown = sorted(set(model) - set(VARIANT_MODEL_KEYS), key=str)
    if unknown:
        raise RunConfigError(f"variant {variant}: unknown key(s) {unknown}; allowed: "
                             f"{', '.join(VARIANT_MODEL_KEYS + VARIANT_TRAIN_KEYS)} and the options of "
                             f"residual={variant.get('residual')!r}: {kind.options.names() if kind else []}")
    train = {k: v for k, v in variant.items() if k in VARIANT_TRAIN_KEYS}
    values = {**base, "out_dir": out_dir, "model": {**base.get("model", {}), **model},
              "train": {**base.get("train", {}), **train, "seed": seed}}
    return RunConfig.from_dict(values)


def variant_slug(variant: dict) -> str:
    """Run folder name of a variant: `variant_name` as a case-keeping slug, e.g. "delta_block-N-4"."""
    return slug(variant_name(variant), keep_case=True, fallback="variant")
