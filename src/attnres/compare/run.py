"""`attnres compare`: train every variant with the same data order, seed and token budget."""

from __future__ import annotations

import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnres.analysis.depth_stats import collect_depth_stats
from attnres.compare.presets import ComparePreset, variant_run, variant_slug
from attnres.compare.report import write_report
from attnres.data import TokenBatches, eval_batches
from attnres.model.config import variant_name
from attnres.train.loop import train
from attnres.train.memory import measure_step_memory
from attnres.train.metrics import read_metrics

WARMUP_STEPS_EXCLUDED = 3  # first steps pay one-off costs (allocation, caches)


def run_compare(preset: ComparePreset, out_dir: Path, seeds: int | None = None, command: str = "",
                device: str = "cpu", log=print) -> dict:
    """Train preset.variants x seeds into out_dir/runs/, then write the report; returns results."""
    out_dir = Path(out_dir)
    seed_list = list(range(seeds or preset.seeds))
    variants = [{"name": variant_name(v), **v, "runs": []} for v in preset.variants]
    for seed in seed_list:  # seeds outer, variants inner: a partial run still compares like with like
        for variant, spec in zip(variants, preset.variants):
            run = variant_run(preset.run, spec, seed, str(out_dir / "runs" / variant_slug(spec) / f"seed{seed}"))
            log(f"[{variant['name']} seed {seed}] training {run.train.steps} steps ...")
            result = train(run, device=device, log=log)
            variant["runs"].append(_run_record(run, result, seed, device))
            log(f"[{variant['name']} seed {seed}] val loss {result.final_val_loss:.4f}, "
                f"median step {variant['runs'][-1]['step_time_s']:.3f} s")
    settings = preset.run
    results = {
        "preset": preset.name, "description": preset.description, "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "settings": {"model": settings.get("model", {}), "data": settings.get("data", {}),
                     "train": settings.get("train", {})},
        "seeds": seed_list,
        "variants": variants,
    }
    write_report(results, out_dir)
    return results


def _run_record(run, result, seed: int, device: str) -> dict:
    records = read_metrics(result.run_dir)
    times = result.step_times[WARMUP_STEPS_EXCLUDED:] or result.step_times
    cfg = run.train
    val = [b.to(device) for b in eval_batches(result.data.val_tokens, cfg.seq_len, cfg.batch_size, cfg.eval_batches)]
    probe = TokenBatches(result.data.train_tokens, cfg.seq_len, cfg.batch_size, cfg.seed).next_batch().to(device)
    memory = measure_step_memory(result.model, probe, torch.bfloat16 if cfg.precision == "bf16" else None)
    step_time = statistics.median(times)
    return {
        "seed": seed,
        "run_dir": str(result.run_dir),
        "val_curve": [[r["step"], r["val_loss"]] for r in records if "val_loss" in r],
        "train_curve": [[r["step"], r["loss"]] for r in records if "loss" in r],
        "final_val_loss": result.final_val_loss,
        "step_time_s": step_time,
        "tokens_per_s": cfg.tokens_per_step / step_time,
        "tokens": cfg.steps * cfg.tokens_per_step,
        "peak_memory_bytes": memory["peak_bytes"],
        "activation_bytes": memory["activation_bytes"],
        "depth_stats": collect_depth_stats(result.model, val).to_dict(),
    }
