"""Comparison presets: a base run, the variants to train on it, and the number of seeds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnres.common.checks import check_int, is_number
from attnres.common.config_files import bundled_config_dir, bundled_presets, prefixed_overrides, read_preset
from attnres.compare.cost_measurement import CostSettings
from attnres.compare.protocol import Protocol
from attnres.report.variant_names import variant_name
from attnres.residual import VARIANTS
from attnres.residual.legacy import upgrade_model_fields
from attnres.report.names import slug
from attnres.train.train_config import TrainConfig
from attnres.train.run_config import RunConfig, RunConfigError, apply_overrides


# What a variant may set: the residual and its options (model fields; the options under
# residual_options or at the top level) and the router-query initialisation.
VARIANT_MODEL_KEYS = ("residual", "residual_options")
VARIANT_TRAIN_KEYS = ("query_init",)


PRESET_KEYS = ("description", "run", "variants", "seeds", "seed_start", "cost", "protocol", "rates_from")
COST_PREFIX = "cost."  # an override `cost.repeats=10` sets the cost measurement, not the run
PROTOCOL_PREFIX = "protocol."  # `protocol.lr_grid=[1e-3,2e-3]` sets the learning-rate search


@dataclass(frozen=True)
class ComparePreset:
    """name, description, the base run dict (model without residual), variants, seeds, the
    settings of the cost measurement after training (`cost:`, `CostSettings`) and, for the fair-comparison
    protocol (`attnres.compare.protocol`), its learning-rate search (`protocol:`; None: one rate for all).
    rates: each variant's peak learning rate by name, read from a protocol study's results
    (`rates_from:`, a folder holding its results.json); None: the run's lr for every variant.
    seed_start: the first seed without a protocol (seeds seed_start ... seed_start + seeds - 1), so that
    runs pair by seed with a protocol study's final runs (the protocol's equal-time arm)."""

    name: str
    description: str
    run: dict
    variants: list[dict]
    seeds: int
    cost: CostSettings = CostSettings()
    protocol: Protocol | None = None
    rates: dict[str, float] | None = None
    rates_from: str | None = None
    seed_start: int = 0

    def run_of(self, variant: dict, seed: int, out_dir: str) -> RunConfig:
        """`variant_run` of this preset's run, at the variant's own rate where `rates` gives one."""
        base = self.run if self.rates is None else at_rate(self.run, self.rates[variant_name(variant)])
        return variant_run(base, variant, seed, out_dir)


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
    searched, run_overrides = prefixed_overrides(run_overrides, PROTOCOL_PREFIX,
                                                 "protocol.key=value (e.g. protocol.grid_seeds=1)", RunConfigError)
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
    seed_start = values.get("seed_start", 0)
    check_int(seed_start, f"preset {path}: seed_start", minimum=0, error=RunConfigError)
    for variant in variants:  # validate every variant's run now, before any training starts
        variant_run(run, variant, seed=0, out_dir="unused")
    protocol = None
    if values.get("protocol") is not None or searched:
        protocol = Protocol.from_dict({**(values.get("protocol") or {}), **searched}, f"preset {path}")
        test_fraction = variant_run(run, variants[0], seed=0, out_dir="unused").data.test_fraction
        if not test_fraction:
            raise RunConfigError(f"preset {path}: the protocol reports on a test split; set run.data.test_fraction "
                                 f"(e.g. 0.05), got {test_fraction}")
    rates_from = values.get("rates_from")
    rates = None if rates_from is None else chosen_rates(rates_from, variants, f"preset {path}")
    if rates is not None and protocol is not None:
        raise RunConfigError(f"preset {path}: set 'protocol' (search the rates) or 'rates_from' (take them from a "
                             f"finished search), not both")
    if seed_start and protocol is not None:
        raise RunConfigError(f"preset {path}: seed_start is for a comparison without a protocol; a protocol's final "
                             f"seeds start at protocol.final_seed_start")
    return ComparePreset(path.stem, values.get("description", ""), run, variants, seeds, cost, protocol, rates,
                         rates_from, seed_start)


def chosen_rates(folder, variants: list[dict], where: str) -> dict[str, float]:
    """Each variant's chosen peak rate (by `variant_name`) from a protocol study's folder/results.json."""
    path = Path(str(folder)) / "results.json"
    try:
        saved = json.loads(path.read_text())
    except OSError as error:
        raise RunConfigError(f"{where}: rates_from {folder!r}: cannot read {path} ({error.strerror}); run that "
                             f"study first (tools/studies/fair.sh)") from None
    except (ValueError, RecursionError) as error:
        raise RunConfigError(f"{where}: rates_from {folder!r}: {path} is not valid JSON ({error})") from None
    variants_found = saved.get("variants") if isinstance(saved, dict) else None
    fits = isinstance(variants_found, list) and all(
        isinstance(v, dict) and isinstance(v.get("name"), str) and is_number(v.get("chosen_lr")) and v["chosen_lr"] > 0
        for v in variants_found)
    if not fits:  # a section null, of another type, or a variant without its rate: named, not a TypeError
        got = type(saved).__name__ if not isinstance(saved, dict) else f"variants = {str(variants_found)[:80]}"
        raise RunConfigError(f"{where}: rates_from {folder!r}: {path} is not a protocol study's results: its "
                             f"'variants' must be a list of objects, each with a 'name' and a positive "
                             f"'chosen_lr'; got {got}")
    found = {v["name"]: float(v["chosen_lr"]) for v in variants_found}
    missing = [variant_name(v) for v in variants if variant_name(v) not in found]
    if missing:
        raise RunConfigError(f"{where}: rates_from {folder!r} chose no rate for {missing}; it has {sorted(found)}")
    return {variant_name(v): found[variant_name(v)] for v in variants}


def at_rate(base: dict, rate: float) -> dict:
    """The run dict `base` at peak learning rate `rate`, its min_lr keeping the ratio to lr it has."""
    train = base.get("train", {})
    defaults = TrainConfig()
    lr, min_lr = train.get("lr", defaults.lr), train.get("min_lr", defaults.min_lr)
    return {**base, "train": {**train, "lr": rate, "min_lr": float(f"{min_lr * rate / lr:.6g}")}}


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
