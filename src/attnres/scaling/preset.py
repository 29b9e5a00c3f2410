"""Scaling presets: a grid of model sizes, the rules that derive each size's shape and token budget,
the variants, and the base run every size shares (docs/explanation/scaling-law.md).

A preset YAML holds `description`, `seeds`, `variants` (as `attnres compare` takes them), `sizes`
(hidden_size and num_layers, optionally seeds and any shape field that departs from the rules),
`rules` (`SizeRules`), `gpu` (`GpuEstimate`, for the dry run's GPU-hours) and `run` (the base
RunConfig dict; the rules fill in the model's shape and the train section's steps, warm-up,
evaluation and checkpoint intervals).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from attnres.common.checks import check_int, check_positive_number, is_number
from attnres.common.config_files import bundled_presets, prefixed_overrides, read_preset
from attnres.compare.plan import Throughput
from attnres.compare.presets import variant_run
from attnres.report.variant_names import variant_name
from attnres.train.run_config import RunConfigError, apply_overrides, yaml_number

PRESET_KEYS = ("description", "seeds", "variants", "sizes", "rules", "gpu", "run")
SIZE_SHAPE_KEYS = ("num_heads", "num_kv_heads", "head_dim", "intermediate_size", "tie_embeddings")
SIZE_KEYS = ("hidden_size", "num_layers", "seeds", *SIZE_SHAPE_KEYS)
RULES_PREFIX = "rules."  # an override `rules.tokens_per_parameter=5` sets a rule, not the run


class ScalingPresetError(RunConfigError):
    """A scaling preset that cannot be used; the message names the key and what is allowed."""


@dataclass(frozen=True)
class SizeRules:
    """How a size's shape, token budget and schedule follow from its width and depth.

    num_heads = hidden_size / head_dim; num_kv_heads = num_heads / kv_groups (at least 1);
    intermediate_size = ffn_ratio x hidden_size rounded up to a multiple of ffn_multiple;
    tokens = tokens_per_parameter x the standard model's non-embedding parameters, rounded up to
    whole optimizer steps (every variant of a size trains on the same tokens, in the same order);
    warm-up = warmup_fraction of the steps, cosine to min_lr_ratio x lr; `evaluations` validation
    points per run, the last at the final step (the loss the fit uses).
    """

    head_dim: int = 64
    kv_groups: int = 1
    ffn_ratio: float = 3.0
    ffn_multiple: int = 16
    tokens_per_parameter: float = 20.0
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1
    evaluations: int = 4

    def __post_init__(self) -> None:
        for name in ("head_dim", "kv_groups", "ffn_multiple", "evaluations"):
            check_int(getattr(self, name), f"rules.{name}", error=ScalingPresetError)
        for name in ("ffn_ratio", "tokens_per_parameter"):  # finite too: rounded up to a whole width / steps
            check_positive_number(getattr(self, name), f"rules.{name}", error=ScalingPresetError)
        for name in ("warmup_fraction", "min_lr_ratio"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value < 1:
                raise ScalingPresetError(f"rules.{name} must be a number in [0, 1), got {value!r}")

    def shape(self, size: dict) -> dict:
        """ModelConfig shape fields of a size entry: the rules, then the entry's explicit fields."""
        width = size["hidden_size"]
        head_dim = size.get("head_dim", self.head_dim)
        heads = size.get("num_heads", max(1, width // head_dim))
        ffn = self.ffn_multiple * math.ceil(self.ffn_ratio * width / self.ffn_multiple)
        shape = {"hidden_size": width, "num_layers": size["num_layers"], "num_heads": heads,
                 "num_kv_heads": max(1, heads // self.kv_groups), "head_dim": head_dim, "intermediate_size": ffn}
        return {**shape, **{k: size[k] for k in SIZE_SHAPE_KEYS if k in size}}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuEstimate(Throughput):
    """What the dry run's GPU-hours assume (`Throughput`: peak_tflops, mfu, name; `hours`), checked as a
    preset's `gpu` section."""

    def __post_init__(self) -> None:
        check_positive_number(self.peak_tflops, "gpu.peak_tflops", error=ScalingPresetError)
        if not is_number(self.mfu) or not 0 < self.mfu <= 1:
            raise ScalingPresetError(f"gpu.mfu must be a number in (0, 1], got {self.mfu!r}")


@dataclass(frozen=True)
class ScalingPreset:
    """name, description, variants (`attnres compare` variant dicts), sizes (size entries), seeds (the
    default per size), rules, gpu, and the base run dict."""

    name: str
    description: str
    variants: list[dict]
    sizes: list[dict]
    seeds: int
    rules: SizeRules
    gpu: GpuEstimate
    run: dict


def available_presets() -> list[str]:
    """Names of the bundled presets (`configs/scaling/`)."""
    return bundled_presets("scaling")


def load_preset(name_or_path: str, overrides: list[str] = (), variants: list[str] | None = None,
                sizes: list[str] | None = None) -> ScalingPreset:
    """A bundled preset by name or a preset YAML by path; `overrides` ("section.key=value") apply to
    its base run, those starting with "rules." to its rules; `variants` keeps only the variants with
    these names or residuals (standard must stay: it is what the advantage is measured against);
    `sizes` keeps only the sizes with these names ("d64-l8", `size_name`): a part of the sweep, whose
    runs are the full sweep's runs (the same settings, so they are reused either way)."""
    path, values = read_preset("scaling", name_or_path, PRESET_KEYS,
                               "a mapping with sizes, rules, variants and run", ScalingPresetError)
    changed, run_overrides = prefixed_overrides(overrides, RULES_PREFIX, "rules.key=value (e.g. "
                                                "rules.tokens_per_parameter=5)", ScalingPresetError)
    run = apply_overrides(values.get("run") or {}, run_overrides)
    _check_base_run(run, path)
    rules = values.get("rules") or {}
    rules = _dataclass(SizeRules, {**rules, **changed} if isinstance(rules, dict) else rules, "rules")
    gpu = _dataclass(GpuEstimate, values.get("gpu") or {}, "gpu")
    seeds = values.get("seeds", 1)
    check_int(seeds, f"scaling preset {path}: seeds", error=ScalingPresetError)
    chosen = _chosen_variants(values.get("variants") or [], variants, path)
    entries = values.get("sizes") or []
    if not isinstance(entries, list):
        raise ScalingPresetError(f"scaling preset {path}: 'sizes' must be a list of mappings with hidden_size and "
                                 f"num_layers, got {entries!r}")
    sizes = _chosen_sizes([_size_entry(size, i, path) for i, size in enumerate(entries)], sizes, path)
    if len(sizes) < 2:
        raise ScalingPresetError(f"scaling preset {path}: 'sizes' must list at least 2 sizes (a law has 2 or 3 "
                                 f"parameters; 5 or more give the fit room), got {len(sizes)}")
    preset = ScalingPreset(path.stem, values.get("description", ""), chosen, sizes, seeds, rules, gpu, run)
    for size in sizes:  # every run's settings validated now, before anything trains
        for variant in chosen:
            variant_run(size_run(preset, size, tokens=1), variant, seed=0, out_dir="unused")
    return preset


def size_run(preset: ScalingPreset, size: dict, tokens: int) -> dict:
    """The base run dict of one size trained on `tokens` tokens: the rules' shape in the model section,
    and steps (tokens / tokens per step, rounded up), warm-up, evaluation and checkpoint intervals."""
    model = {**preset.run.get("model", {}), **preset.rules.shape(size)}
    train = dict(preset.run.get("train", {}))
    per_step = train.get("batch_size", 16) * train.get("grad_accum", 1) * train.get("seq_len", 256)
    steps = max(1, math.ceil(tokens / per_step))
    lr = float(train.get("lr", 6e-4))
    train.update(steps=steps, warmup_steps=int(preset.rules.warmup_fraction * steps),
                 min_lr=lr * preset.rules.min_lr_ratio, eval_every=max(1, math.ceil(steps / preset.rules.evaluations)),
                 checkpoint_every=max(1, math.ceil(steps / 2)))  # a checkpoint halfway: an interrupted run resumes
    return {**preset.run, "model": model, "train": train}


def size_name(size: dict) -> str:
    """The folder and table name of a size: "d64-l8" (hidden size, layers)."""
    return f"d{size['hidden_size']}-l{size['num_layers']}"


def size_seeds(preset: ScalingPreset, size: dict, seeds: int | None = None) -> list[int]:
    """The seeds a size trains: its own `seeds`, else the preset's; `seeds` (the command's --seeds) overrides both."""
    return list(range(seeds or size.get("seeds", preset.seeds)))


def _size_entry(size, index: int, path: Path) -> dict:
    where = f"scaling preset {path}: sizes[{index}]"
    if not isinstance(size, dict):
        raise ScalingPresetError(f"{where} must be a mapping with hidden_size and num_layers, got {size!r}")
    unknown = sorted(set(size) - set(SIZE_KEYS), key=str)
    if unknown:
        raise ScalingPresetError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(SIZE_KEYS)}")
    for key in ("hidden_size", "num_layers", "seeds", "head_dim", "num_heads"):  # rules divide by the last 2
        if key in size:
            check_int(size[key], f"{where}.{key}", error=ScalingPresetError)
        elif key in ("hidden_size", "num_layers"):
            raise ScalingPresetError(f"{where} needs {key}")
    return dict(size)


def _check_base_run(run: dict, path: Path) -> None:
    """What `size_run` reads of the base run before RunConfig checks it: the model and train
    sections as mappings, the batch shape as integers and lr as a number."""
    for section in ("model", "train"):
        if not isinstance(run.get(section, {}), dict):
            raise ScalingPresetError(f"scaling preset {path}: run.{section} must be a mapping of its fields, got "
                                     f"{run[section]!r}")
    train = run.get("train", {})
    for key in ("batch_size", "grad_accum", "seq_len"):
        if key in train:
            check_int(train[key], f"scaling preset {path}: run.train.{key}", error=ScalingPresetError)
    if "lr" in train and not is_number(yaml_number(train["lr"])):
        raise ScalingPresetError(f"scaling preset {path}: run.train.lr must be a number, got {train['lr']!r}")


def _chosen_sizes(entries: list[dict], names: list[str] | None, path: Path) -> list[dict]:
    if not names:
        return entries
    known = [size_name(e) for e in entries]
    missing = [n for n in names if n not in known]
    if missing:
        raise ScalingPresetError(f"--sizes: {missing} not in preset {path.stem}; its sizes: {known}")
    return [e for e in entries if size_name(e) in names]


def _chosen_variants(variants: list, names: list[str] | None, path: Path) -> list[dict]:
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants) or not any(
            v.get("residual") == "standard" for v in variants):
        raise ScalingPresetError(f"scaling preset {path}: 'variants' must list residual schemes and include standard")
    if not names:
        return list(variants)
    known = {variant_name(v): v for v in variants}
    chosen = [v for v in variants if variant_name(v) in names or v["residual"] in names]
    missing = [n for n in names if n not in known and n not in {v["residual"] for v in variants}]
    if missing:
        raise ScalingPresetError(f"--variants: {missing} not in preset {path.stem}; its variants: {list(known)}")
    if not any(v["residual"] == "standard" for v in chosen):
        raise ScalingPresetError("--variants must include standard: the compute advantage is measured against it")
    return chosen


def _dataclass(kind, values: dict, section: str):
    if not isinstance(values, dict):
        raise ScalingPresetError(f"'{section}' must be a mapping of {[f.name for f in fields(kind)]}, got {values!r}")
    allowed = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - allowed, key=str)
    if unknown:
        raise ScalingPresetError(f"unknown {section} key(s) {unknown}; allowed: {sorted(allowed)}")
    return kind(**{key: yaml_number(value) for key, value in values.items()})

