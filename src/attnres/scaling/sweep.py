"""`attnres scaling`: train the size grid of a preset for every variant, fit loss against compute, write
the report (docs/explanation/scaling-law.md).

Every run is an `attnres train` run: in this process (`attnres.train.train`, what `attnres train`
calls), or, with a launcher such as "torchrun --nproc-per-node 8", as `<launcher> -m attnres train
--config <run>/config.yaml` in a child process, so a GPU preset runs on torchrun unchanged. Either way
the run's record is read back from its folder (metrics.jsonl), written atomically beside it, and
reused by later calls; an interrupted run resumes from its checkpoint (one of other settings is
refused, naming them: `attnres.train.resume.check_same_settings`). `--shard I/N` trains a
FLOPs-balanced share and writes no report; a last call without it writes the report.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml

from attnres.checkpoint import checkpoint_dirs
from attnres.common.atomic import write_atomic
from attnres.common.errors import InputError
from attnres.common.machine import machine_info
from attnres.checkpoint.run_lock import RunLock
from attnres.compare.cost_measurement import MIN_REPEATS, CostSettings, measure_costs
from attnres.compare.progress import CompareProgress
from attnres.compare.run_comparison import finished_record
from attnres.data import prepare_data
from attnres.report.variant_names import variant_name
from attnres.scaling.plan import PlannedRun, plan_sweep, standard_run
from attnres.scaling.preset import ScalingPreset
from attnres.train import TrainingError, train
from attnres.train.metrics import read_metrics
from attnres.train.resume import check_same_settings
from attnres.train.stability import run_totals

RECORD_FILE = "scaling_record.json"  # in each run's folder: its settings and results, once finished
RECORD_KEYS = ("size", "seed", "parameters", "flops", "final_val_loss")  # what the fit and report read of every record


def run_sweep(preset: ScalingPreset, out_dir: Path, seeds: int | None = None, command: str = "",
              device: str = "cpu", shard: tuple[int, int] = (0, 1), launcher: str | None = None,
              replicates: int = 1000, cost_repeats: int = 11, log=print, progress: bool | None = None,
              force: bool = False) -> dict | None:
    """Train (or reuse) every run of the sweep into out_dir/runs/<size>/<variant>/seed<k>/, then fit and
    write the report (results.json, report.md, index.html, figures/); returns the results dict, or
    None for a shard (shard=(i, n) with n > 1 trains its share and writes nothing else).
    launcher: a command prefix that runs `-m attnres train` (e.g. "torchrun --nproc-per-node 8");
    None trains in this process. replicates: bootstrap replicates of the fit. cost_repeats: rounds of the
    step-time measurement at the largest size (`attnres.compare.cost_measurement.measure_costs`, every variant
    interleaved in this process, on `device`), 0 to skip it (a model too large for one device)."""
    if not (isinstance(cost_repeats, int) and (cost_repeats == 0 or cost_repeats >= MIN_REPEATS)):
        raise InputError(f"cost_repeats (--cost-repeats) must be 0 (no step-time measurement) or an integer >= "
                         f"{MIN_REPEATS}, got {cost_repeats!r}")  # checked before hours of training, not after
    out_dir = Path(out_dir)
    planned = plan_sweep(preset, out_dir, seeds, shard)
    # One process per --out folder, or per shard of it: a second one stops at once (RunLock).
    with RunLock(out_dir, "--out", shard):
        records = {id(p): finished_record(p.run, RECORD_FILE, RECORD_KEYS) for p in planned}
        todo = [p for p in planned if records[id(p)] is None and p.mine]
        for p in todo:  # an interrupted run of other settings: refused (forced: discarded) before training
            check_same_settings(p.run, force, log)
        todo.sort(key=lambda p: p.flops)  # smallest first: a stopped sweep has its small sizes done
        display = CompareProgress(sum(records[id(p)] is not None or p.mine for p in planned),
                                  sum(records[id(p)] is not None for p in planned),
                                  sum(p.run.train.steps for p in todo), log=log, interactive=progress,
                                  command="scaling")
        try:
            for p in todo:
                records[id(p)] = _train_run(p, device, launcher, display)
            if shard[1] > 1:
                return None
            display.phase("fitting and writing the report")
            from attnres.report.scaling_report import write_scaling_report  # only here: a shard never reports

            results = sweep_results(preset, planned, [records[id(p)] for p in planned], command, device,
                                    replicates)
            if cost_repeats:
                display.phase("measuring the step time at the largest size (every variant interleaved)")
                results["cost_size"], results["cost"] = measure_largest(planned, cost_repeats, device,
                                                                        display.phase)
            write_scaling_report(results, out_dir)
            return results
        finally:
            display.close()


def sweep_results(preset: ScalingPreset, planned: list[PlannedRun], records: list[dict], command: str,
                  device: str, replicates: int) -> dict:
    """The dict `write_scaling_report` renders: the plan's sizes, every variant with its runs' records,
    and the fit (`summarize_sweep`)."""
    from attnres.scaling.summary import summarize_sweep  # only here: a shard never fits

    variants = [{"name": variant_name(v), **v, "runs": []} for v in preset.variants]
    by_name = {v["name"]: v for v in variants}
    for p, record in zip(planned, records, strict=True):
        by_name[p.name]["runs"].append(record)
    train_tokens = len(prepare_data(planned[0].run.data).train_tokens)  # the cache the runs filled: reads no text
    sizes = []
    for size in preset.sizes:
        standard, seeds = standard_run(planned, size)
        sizes.append({"name": standard.size, **{k: getattr(standard.run.model, k) for k in (
            "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")},
            "parameters": standard.parameters, "total_parameters": standard.total_parameters,
            "tokens": standard.tokens, "epochs": standard.tokens / train_tokens, "steps": standard.run.train.steps,
            "seeds": seeds})
    return {
        "preset": preset.name, "description": preset.description, "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(torch.device(device)),
        "rules": {**preset.rules.to_dict(), "parameters counted": "non-embedding, of the standard model",
                  "training split": f"{train_tokens:,} tokens",
                  "batch x seq_len": f"{planned[0].run.train.batch_size} x {planned[0].run.train.seq_len}",
                  "lr": planned[0].run.train.lr, "precision": planned[0].run.train.precision,
                  "data": planned[0].run.data.source},
        "settings": {"model": preset.run.get("model", {}), "data": preset.run.get("data", {}),
                     "train": preset.run.get("train", {})},
        "sizes": sizes,
        "variants": variants,
        "fit": summarize_sweep(variants, replicates=replicates),
    }


def measure_largest(planned: list[PlannedRun], repeats: int, device: str, log) -> tuple[str, dict]:
    """(size name, `measure_costs` result) for seed 0's runs of the largest size, one per variant."""
    largest = max(planned, key=lambda p: p.flops).size
    runs = {p.name: p.run for p in planned if p.size == largest and p.seed == 0}
    vocab = prepare_data(next(iter(runs.values())).data).tokenizer.vocab_size  # the token cache's: reads no text
    return largest, measure_costs(runs, vocab, CostSettings(repeats=repeats, warmup=2), device, log=log)


def _train_run(p: PlannedRun, device: str, launcher: str | None, display: CompareProgress) -> dict:
    """Train (or resume) one run and write its record atomically into its folder."""
    folder = Path(p.run.out_dir)
    resume = bool(checkpoint_dirs(folder / "checkpoints"))
    if resume:  # an interrupted run of other settings is refused, never resumed under this invocation's
        check_same_settings(p.run)
    label = f"{p.size} {p.name} seed {p.seed}"
    display.start_run(label, p.run.train.steps, "resuming" if resume else "training")
    if launcher is None:
        # force: the sweep owns its run folders; one without a checkpoint is started again
        train(p.run, resume=resume, device=device, log=display.note, on_step=display.step, force=True)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yaml"  # the trainer writes the same settings here again
        write_atomic(config, yaml.safe_dump(p.run.to_dict(), sort_keys=False))
        argv = [*shlex.split(launcher), "-m", "attnres", "train", "--config", str(config), "--device", device,
                "--resume" if resume else "--force"]
        display.note(f"[{label}] {shlex.join(argv)}")
        finished = subprocess.run(argv, check=False)
        if finished.returncode:
            raise TrainingError(f"{label}: `{shlex.join(argv)}` exited with {finished.returncode}")
    record = run_record(p)
    write_atomic(folder / RECORD_FILE, json.dumps({"run": p.run.to_dict(), "record": record}))
    display.finish_run(f"{label}: val loss {record['final_val_loss']:.4f}, {record['flops']:.3g} FLOPs")
    return record


def run_record(p: PlannedRun) -> dict:
    """What the fit and the report need of a finished run, read from its metrics.jsonl: the final
    validation loss (evaluated at the last step), the curve, divergence events, the median step time."""
    metrics = read_metrics(Path(p.run.out_dir))
    last = [r for r in metrics if r.get("step") == p.run.train.steps and "val_loss" in r]
    if not last:
        raise TrainingError(f"{p.run.out_dir}: metrics.jsonl has no validation loss at the last step "
                            f"{p.run.train.steps}; the run did not finish")
    times = [r["step_time_s"] for r in metrics if "step_time_s" in r]
    return {"size": p.size, "seed": p.seed, "parameters": p.parameters, "total_parameters": p.total_parameters,
            "tokens": p.tokens, "flops": p.flops, "final_val_loss": last[-1]["val_loss"],
            "val_curve": [[r["step"], r["val_loss"]] for r in metrics if "val_loss" in r],
            "stability": run_totals(metrics),
            "step_time_s": statistics.median(times) if times else None, "run_dir": str(p.run.out_dir)}

