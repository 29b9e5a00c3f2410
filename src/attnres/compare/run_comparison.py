"""`attnres compare`: train every variant with the same data order, seed and token budget, then measure
their cost in one process (`attnres.compare.cost_measurement`) and write the report (`attnres.report.compare_report`)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnres.analysis import collect_depth_stats, collect_expert_loads
from attnres.checkpoint import checkpoint_dirs
from attnres.common.atomic import write_atomic
from attnres.common.errors import InputError
from attnres.common.machine import machine_info
from attnres.compare.cost_measurement import measure_costs
from attnres.compare.headline import comparison_headline
from attnres.compare.presets import ComparePreset, variant_run, variant_slug
from attnres.compare.progress import CompareProgress
from attnres.data import eval_batches, prepare_data
from attnres.report.variant_names import variant_name
from attnres.report.compare_report import write_report
from attnres.routing import resolve_impl
from attnres.train import train
from attnres.train.evaluate import evaluate
from attnres.train.metrics import read_metrics
from attnres.train.resume import check_same_settings
from attnres.train.run_config import RunConfig, RunConfigError
from attnres.train.stability import run_totals

WARMUP_STEPS_EXCLUDED = 3  # first steps pay one-off costs (allocation, caches)


RECORD_FILE = "compare_record.json"  # in each run's folder: its settings and results, once finished
RECORD_KEYS = ("seed", "final_val_loss", "val_curve", "depth_stats")  # what the report reads of every record


@dataclass
class _PlannedRun:
    """One run of the comparison: its variant, seed, settings, the record of a finished run (or None)
    and whether this process (shard) trains it."""

    variant: dict
    seed: int
    run: RunConfig
    record: dict | None
    mine: bool


def run_compare(preset: ComparePreset, out_dir: Path, seeds: int | None = None, command: str = "",
                device: str = "cpu", log=print, shard: tuple[int, int] = (0, 1),
                progress: bool | None = None, force: bool = False) -> dict | None:
    """Train preset.variants x seeds into out_dir/runs/, measure their cost, write the report; returns results.

    A run whose folder holds a finished record with the same settings is not trained again, and an
    interrupted run resumes from its last checkpoint, so a long comparison can be stopped and
    restarted; a record or checkpoint of other settings is refused before anything trains, naming
    them (`attnres.train.resume.check_same_settings`; with `force`, such an interrupted run is
    discarded and trained again). shard=(i, n) trains only runs i, i + n, ... (in seed-major order) and writes no
    report (returns None): n processes can share the work; a final unsharded call reuses their
    records and writes the report. The cost measurement (`attnres.compare.cost_measurement.measure_costs`, every
    variant interleaved in this process) is made anew by every call that writes the report: a
    ratio is only meaningful between variants timed in the same rounds, and a record of an earlier
    process would carry that machine's load into a report written on a quieter one.
    progress: a bar over the whole comparison (True), plain progress lines through `log` (False), or
    None for a bar only when stderr is a terminal (`CompareProgress`).
    """
    index, count = shard
    if not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count):
        raise InputError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    out_dir = Path(out_dir)
    seed_list = list(range(preset.seed_start, preset.seed_start + (seeds or preset.seeds)))
    variants = [{"name": variant_name(v), **v, "runs": []} for v in preset.variants]
    plan = []
    for seed in seed_list:  # seeds outer, variants inner: a partial run still compares like with like
        for variant, spec in zip(variants, preset.variants):
            run = preset.run_of(spec, seed, str(out_dir / "runs" / variant_slug(spec) / f"seed{seed}"))
            plan.append(_PlannedRun(variant, seed, run, finished_record(run), len(plan) % count == index))
    todo = [p for p in plan if p.record is None and p.mine]
    for planned in todo:  # an interrupted run of other settings: refused (or, forced, discarded) before anything trains
        check_same_settings(planned.run, force, log)
    display = CompareProgress(sum(p.record is not None or p.mine for p in plan), sum(p.record is not None for p in plan),
                              sum(p.run.train.steps for p in todo), log=log, interactive=progress)
    try:
        for planned in plan:
            name = planned.variant["name"]
            if planned.record is not None:
                display.note(f"[{name} seed {planned.seed}] finished earlier: val loss "
                             f"{planned.record['final_val_loss']:.4f}")
            elif planned.mine:
                planned.record = train_variant(planned.run, name, planned.seed, device, display, force)
            if planned.record is not None:
                planned.variant["runs"].append(planned.record)
        if count > 1:
            return None
        display.phase("measuring cost (every variant interleaved)")
        cost = _measure_cost(preset, plan, device, display)
        display.phase("writing the report")
        results = _results(preset, command, device, seed_list, variants, cost)
        results["headline"] = comparison_headline(results)
        write_report(results, out_dir)
        return results
    finally:
        display.close()


def _measure_cost(preset: ComparePreset, plan: list[_PlannedRun], device: str, display: CompareProgress) -> dict:
    """`measure_costs` over each variant's first run's settings, with the tokenizer's vocabulary."""
    first_runs: dict[str, RunConfig] = {}
    for planned in plan:
        first_runs.setdefault(planned.variant["name"], planned.run)
    data = next(iter(first_runs.values())).data  # variants share the data settings: one tokenizer
    vocab_size = prepare_data(data).tokenizer.vocab_size  # the token cache's: reads no documents
    return measure_costs(first_runs, vocab_size, preset.cost, device, log=display.phase)


def _results(preset: ComparePreset, command: str, device: str, seed_list: list[int], variants: list[dict],
             cost: dict) -> dict:
    """The results dict `write_report` documents."""
    settings = preset.run
    first = variant_run(preset.run, preset.variants[0], seed=0, out_dir="unused")
    routing_impl = first.train.routing_impl  # the same for every variant
    rates = {} if preset.rates is None else {"rates_from": preset.rates_from, "rates": preset.rates}
    return {
        "preset": preset.name, "description": preset.description, "command": command, **rates,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(torch.device(device)),
        "code_path": {"routing_impl": routing_impl, "routing": resolve_impl(routing_impl, torch.device(device)),
                      "precision": first.train.precision},
        "settings": {"model": settings.get("model", {}), "data": settings.get("data", {}),
                     "train": settings.get("train", {})},
        "seeds": seed_list,
        "variants": variants,
        "cost": cost,
    }


def train_variant(run, name: str, seed: int, device: str, display: CompareProgress, force: bool = False) -> dict:
    """Train (or resume) one run and write its record atomically into its folder."""
    resume = bool(checkpoint_dirs(Path(run.out_dir) / "checkpoints"))
    if resume:  # an interrupted run of other settings is refused (forced: discarded), never resumed under these
        check_same_settings(run, force, display.note)
        resume = bool(checkpoint_dirs(Path(run.out_dir) / "checkpoints"))
    display.start_run(f"{name} seed {seed}", run.train.steps, "resuming" if resume else "training")
    # force: the comparison owns its run folders; one without a checkpoint is started again
    result = train(run, resume=resume, device=device, log=display.note, on_step=display.step, force=True)
    record = _run_record(run, result, seed, device)
    write_atomic(Path(run.out_dir) / RECORD_FILE, json.dumps({"run": run.to_dict(), "record": record}))
    display.finish_run(f"{name} seed {seed}: val loss {result.final_val_loss:.4f}, median training step "
                       f"{record['step_time_s']:.3f} s (wall time, not a cost measurement)")
    return record


def finished_record(run: RunConfig, filename: str = RECORD_FILE,
                    keys: tuple[str, ...] = RECORD_KEYS) -> dict | None:
    """The record a finished run left in its folder (`filename`); None if there is none. A record of
    other settings is an error: the folder belongs to another comparison or sweep; so is one without
    all of `keys`, which the report reads (an earlier version's)."""
    path = Path(run.out_dir) / filename
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        settings, record = saved["run"], saved["record"]
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise RunConfigError(f"{path} is unreadable ({error}); delete it to train that run again") from None
    try:  # through RunConfig: a field added since the record was written takes its default
        settings = RunConfig.from_dict(settings).to_dict()
    except (ValueError, TypeError):
        pass  # settings this version cannot read: they differ
    if settings != run.to_dict():
        raise RunConfigError(f"{run.out_dir} holds a run with other settings; choose another --out or delete it")
    missing = [key for key in keys if key not in record] if isinstance(record, dict) else list(keys)
    if missing:
        raise RunConfigError(f"{path} is a record of another attnres version (no {', '.join(missing)}); delete it "
                             f"to train that run again")
    wrong = [f"{key} ({expected})" for key, (fits, expected) in RECORD_TYPES.items() if key in record
             and not fits(record[key])]
    if wrong:
        raise RunConfigError(f"{path} is corrupt: {', '.join(wrong)} expected; delete it to train that run again")
    return record


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(value, allow_none: bool = True) -> bool:
    return isinstance(value, list) and all((allow_none and x is None) or _number(x) for x in value)


def _curve(value) -> bool:
    return value is None or isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and _number(p[0]) and (p[1] is None or _number(p[1])) for p in value)


# What the report and the scaling fit read of a record's fields (compare's and scaling's), as they are written.
RECORD_TYPES = {
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    **{key: (lambda v: isinstance(v, str), "a string") for key in ("size", "run_dir")},
    **{key: (_number, "a number") for key in ("final_val_loss", "final_test_loss", "step_time_s", "tokens_per_s", "tokens", "flops",
                                              "parameters", "total_parameters")},
    "val_curve": (_curve, "[[step, loss], ...]"), "train_curve": (_curve, "[[step, loss], ...]"),
    "depth_stats": (lambda v: isinstance(v, dict) and (not v or all(_numbers(v.get(key)) for key in (
        "max_weight", "hidden_rms"))), "an object with lists max_weight and hidden_rms"),
    "stability": (lambda v: v is None or isinstance(v, dict) and all(x is None or _number(x) for x in v.values()),
                  "null or an object of numbers"),
    "expert_load": (lambda v: isinstance(v, list) and all(x and _numbers(x, allow_none=False) for x in v),
                    "a list of per-layer lists of numbers"),
}


def _run_record(run, result, seed: int, device: str) -> dict:
    records = read_metrics(result.run_dir)
    # a run resumed at its last step trained nothing now: use the step times it logged
    times = (result.step_times[WARMUP_STEPS_EXCLUDED:] or result.step_times
             or [r["step_time_s"] for r in records if "step_time_s" in r])
    cfg = run.train
    val = [b.to(device) for b in eval_batches(result.data.val_tokens, cfg.seq_len, cfg.batch_size, cfg.eval_batches)]
    test_tokens = result.data.test_tokens  # read only here, after training; None without a test split
    test = None if test_tokens is None else [b.to(device) for b in eval_batches(test_tokens, cfg.seq_len,
                                                                               cfg.batch_size, cfg.eval_batches)]
    step_time = statistics.median(times)
    expert_load = collect_expert_loads(result.model, val)
    return {
        "seed": seed,
        "run_dir": str(result.run_dir),
        "val_curve": [[r["step"], r["val_loss"]] for r in records if "val_loss" in r],
        "train_curve": [[r["step"], r["loss"]] for r in records if "loss" in r],
        "final_val_loss": result.final_val_loss,
        # the held-out test split (DataConfig.test_fraction), as many batches as validation; no key without one
        **({"final_test_loss": evaluate(result.model, test, cfg.precision)} if test is not None else {}),
        "step_time_s": step_time,  # wall time while training, runs one after another: not a cost figure
        "tokens_per_s": cfg.tokens_per_step / step_time,
        "tokens": cfg.steps * cfg.tokens_per_step,
        "depth_stats": collect_depth_stats(result.model, val).to_dict(),
        "stability": run_totals(records),  # loss / gradient-norm spikes and clipping over the whole run
        # per mixture-of-experts layer, each expert's share of the held-out assignments (no key without experts)
        **({"expert_load": expert_load} if expert_load else {}),
        # where it finished (a run resumed elsewhere trained partly on another): kernels change the bits
        "machine": machine_info(torch.device(device)),
    }
