"""The plan of a scaling sweep: every (size, seed, variant) run with its settings, parameters, tokens
and training FLOPs, the share of each shard, and the dry run's table (docs/explanation/scaling-law.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from attnres.common.errors import InputError
from attnres.compare.plan import hours_text, vocab_size_of
from attnres.compare.presets import variant_run, variant_slug
from attnres.model import ModelConfig
from attnres.report.variant_names import variant_name
from attnres.model.flops import FlopsPerToken, ParameterCount, flops_per_token, parameter_count
from attnres.scaling.preset import ScalingPreset, ScalingPresetError, size_name, size_run, size_seeds
from attnres.train.run_config import RunConfig

@dataclass
class PlannedRun:
    """One run of the sweep: its size's name, variant, seed, settings, parameter counts of
    its model, tokens, training FLOPs (its own variant's, routing included), and whether this shard
    trains it."""

    size: str
    variant: dict
    seed: int
    run: RunConfig
    parameters: int
    total_parameters: int
    tokens: int
    flops: float
    mine: bool = True

    @property
    def name(self) -> str:
        return variant_name(self.variant)


def plan_sweep(preset: ScalingPreset, out_dir: Path, seeds: int | None = None,
               shard: tuple[int, int] = (0, 1)) -> list[PlannedRun]:
    """Every run of the sweep, sizes in the preset's order, then seeds, then variants.

    Tokens per size: rules.tokens_per_parameter x the standard model's non-embedding parameters,
    rounded up to whole steps, the same for every variant of the size. Runs go to shards by
    longest-first greedy assignment on FLOPs (`assign_shards`), so N shards finish together.
    """
    planned, counts = [], {}
    standard = next(v for v in preset.variants if v["residual"] == "standard")
    for size in preset.sizes:
        name = size_name(size)
        probe = variant_run(size_run(preset, size, tokens=1), standard, seed=0, out_dir="unused")
        vocab = vocab_size_of(probe, ScalingPresetError)  # the preset's: the same at every size
        base_params = _counts(probe.model.with_vocab_size(vocab), probe.train.seq_len, counts)[0].non_embedding
        tokens_wanted = preset.rules.tokens_per_parameter * base_params
        base = size_run(preset, size, tokens=math.ceil(tokens_wanted))
        for seed in size_seeds(preset, size, seeds):
            for variant in preset.variants:
                folder = Path(out_dir) / "runs" / name / variant_slug(variant) / f"seed{seed}"
                run = variant_run(base, variant, seed, str(folder))
                count, per_token = _counts(run.model.with_vocab_size(vocab), run.train.seq_len, counts)
                tokens = run.train.steps * run.train.tokens_per_step
                planned.append(PlannedRun(name, variant, seed, run, count.non_embedding, count.total, tokens,
                                          float(per_token.training * tokens)))
    assign_shards(planned, shard)
    return planned


def _counts(config: ModelConfig, seq_len: int, memo: dict) -> tuple[ParameterCount, FlopsPerToken]:
    """Parameters and FLOPs per token of `config`, each distinct config counted once (seeds share one:
    counting builds the model on the meta device, about a second at 7.6B)."""
    key = (json.dumps(config.to_dict(), sort_keys=True), seq_len)
    if key not in memo:
        memo[key] = (parameter_count(config), flops_per_token(config, seq_len))
    return memo[key]


def assign_shards(planned: list[PlannedRun], shard: tuple[int, int]) -> None:
    """Mark the runs of shard (i, n): runs taken largest FLOPs first, each to the least-loaded shard
    (ties to the lower index); deterministic, so every shard process computes the same split."""
    index, count = shard
    if not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count):
        raise InputError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    loads = [0.0] * count
    for position in sorted(range(len(planned)), key=lambda i: (-planned[i].flops, i)):
        target = min(range(count), key=lambda s: (loads[s], s))
        loads[target] += planned[position].flops
        planned[position].mine = target == index


def standard_run(planned: list[PlannedRun], size: dict) -> tuple[PlannedRun, list[int]]:
    """The first planned run of the standard model of size entry `size`, and the seeds the size trains."""
    runs = [p for p in planned if p.size == size_name(size)]
    return next(p for p in runs if p.variant["residual"] == "standard"), sorted({p.seed for p in runs})


def plan_table(preset: ScalingPreset, planned: list[PlannedRun]) -> tuple[list[str], list[list[str]]]:
    """The per-size rows of the plan: shape, parameters, tokens, steps, seeds, standard's FLOPs per run."""
    header = ["size", "width x layers", "heads / kv", "FFN", "parameters (non-emb.)", "total", "tokens", "steps",
              "seeds", "FLOPs per run (standard)"]
    rows = []
    for size in preset.sizes:
        standard, seeds = standard_run(planned, size)
        shape = standard.run.model
        rows.append([standard.size, f"{shape.hidden_size} x {shape.num_layers}",
                     f"{shape.num_heads} / {shape.num_kv_heads}", str(shape.intermediate_size),
                     f"{standard.parameters:,}", f"{standard.total_parameters:,}", f"{standard.tokens:,}",
                     f"{standard.run.train.steps:,}", str(len(seeds)), f"{standard.flops:.3g}"])
    return header, rows


def plan_text(preset: ScalingPreset, planned: list[PlannedRun]) -> str:
    """The dry run's plan: the size table, runs, total FLOPs by variant and the GPU-hours they take at
    the preset's stated peak and MFU."""
    header, rows = plan_table(preset, planned)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [f"scaling preset {preset.name}: {preset.description}",
             f"rules: {', '.join(f'{k} {v}' for k, v in preset.rules.to_dict().items())}", "",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    total = sum(p.flops for p in planned)
    lines += ["", f"{len(planned)} runs ({len(preset.sizes)} sizes x {len(preset.variants)} variants x seeds), "
                  f"{total:.3g} training FLOPs in all", "", "by variant:"]
    for variant in preset.variants:
        flops = sum(p.flops for p in planned if p.variant is variant)
        lines.append(f"  {variant_name(variant)}: {flops:.3g} FLOPs, {hours_text(preset.gpu.hours(flops))} GPU-hours")
    lines.append(f"all: {hours_text(preset.gpu.hours(total))} GPU-hours on {preset.gpu.name} at "
                 f"{preset.gpu.peak_tflops:g} TFLOP/s peak and {preset.gpu.mfu:.0%} MFU (model FLOPs as counted by attnres.model.flops)")
    return "\n".join(lines)
