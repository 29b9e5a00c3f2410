"""Run the fair-comparison protocol (`attnres.compare.protocol`): search, choose, final runs, report.

Runs live in out_dir/runs/<variant>/lr<rate>/seed<k>/ with the record `attnres compare` writes, plus
the test loss. A finished run is never trained again and an interrupted one resumes, so a study can
be built up over several sittings; a finished study is reported again without training anything.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnres.common.errors import InputError
from attnres.common.machine import machine_info
from attnres.checkpoint.run_lock import RunLock
from attnres.compare.cost_measurement import measure_costs
from attnres.compare.presets import ComparePreset, at_rate, variant_run, variant_slug
from attnres.compare.progress import CompareProgress
from attnres.compare.protocol import RateSearch, rate_label, search_rates, unigram_entropy
from attnres.compare.run_comparison import RECORD_KEYS, finished_record, run_compare, train_variant
from attnres.data import prepare_data
from attnres.model import AttnResLM
from attnres.report.variant_names import variant_name
from attnres.report.protocol_report import write_protocol_report
from attnres.routing import resolve_impl
from attnres.train.run_config import RunConfig

PROTOCOL_RECORD_KEYS = (*RECORD_KEYS, "final_test_loss")
WAIT_S = 20.0  # how often a shard looks for the other shards' records when it has nothing to train


@dataclass
class _Run:
    """One run of the protocol: its variant, rate, seed, settings and record (None until finished)."""

    variant: dict
    rate: float
    seed: int
    run: RunConfig
    record: dict | None


def rate_run(preset: ComparePreset, spec: dict, rate: float, seed: int, out_dir: Path) -> RunConfig:
    """The RunConfig of one variant at peak rate `rate` (`at_rate`: min_lr keeps the preset's ratio)."""
    folder = out_dir / "runs" / variant_slug(spec) / rate_label(rate) / f"seed{seed}"
    return variant_run(at_rate(preset.run, rate), spec, seed, str(folder))


class _Survey:
    """Every variant's search and final runs as the records on disk have them now."""

    def __init__(self, preset: ComparePreset, out_dir: Path, final_seeds: int, threshold: float = math.inf) -> None:
        self.preset, self.out_dir, self.final_seeds, self.threshold = preset, out_dir, final_seeds, threshold
        self.runs: dict[tuple[int, float, int], _Run] = {}
        self.searches: list[RateSearch] = []
        self.todo: list[_Run] = []
        protocol = preset.protocol
        order = {}
        for index, spec in enumerate(preset.variants):
            search = search_rates(protocol, lambda rate: self._val_losses(index, rate), threshold)
            self.searches.append(search)
            if search.missing:
                wanted = [(rate, seed) for rate in search.missing for seed in range(protocol.grid_seeds)]
            else:
                wanted = [(search.chosen, seed) for seed in self.seeds_of(index)]
            for rate, seed in wanted:
                if (run := self.run(index, rate, seed)).record is None:
                    self.todo.append(run)
                    order[id(run)] = (not protocol.is_primary(spec), not search.missing, seed)
        # Primary variants first, each one's search before its final runs, then seed-major: a partial
        # study still compares like with like.
        self.todo.sort(key=lambda r: order[id(r)])

    def seeds_of(self, index: int) -> list[int]:
        """The final runs' seeds of variant `index`."""
        return self.preset.protocol.final_seeds(self.preset.variants[index], self.final_seeds)

    def run(self, index: int, rate: float, seed: int) -> _Run:
        key = (index, rate, seed)
        if key not in self.runs:
            spec = self.preset.variants[index]
            run = rate_run(self.preset, spec, rate, seed, self.out_dir)
            record = finished_record(run, keys=PROTOCOL_RECORD_KEYS)
            self.runs[key] = _Run({"name": variant_name(spec), **spec}, rate, seed, run, record)
        return self.runs[key]

    def _val_losses(self, index: int, rate: float) -> list[float] | None:
        records = [self.run(index, rate, seed).record for seed in range(self.preset.protocol.grid_seeds)]
        return None if any(r is None for r in records) else [r["final_val_loss"] for r in records]


def run_preset(preset: ComparePreset, out_dir: Path, **options) -> dict | None:
    """`attnres compare`: the fair-comparison protocol (run_protocol) where `preset` has a
    `protocol:` section, else every variant at the preset's settings (run_compare). `options` are
    those two functions' keywords (seeds, command, device, shard, ...); returns their results. The
    folder is locked while it runs (`attnres.checkpoint.run_lock.RunLock`, by shard where sharded)."""
    runner = run_compare if preset.protocol is None else run_protocol
    # One process per --out folder, or per shard of it: a second one stops at once (RunLock).
    with RunLock(out_dir, "--out", options.get("shard", (0, 1))):
        return runner(preset, out_dir, **options)


def run_protocol(preset: ComparePreset, out_dir: Path, seeds: int | None = None, command: str = "",
                 device: str = "cpu", log=print, shard: tuple[int, int] = (0, 1),
                 progress: bool | None = None, wait_s: float = WAIT_S, force: bool = False) -> dict | None:
    """Search, choose, train the final runs and write the report into out_dir; returns the results.

    seeds: final runs per variant (default: the preset's). shard=(i, n) trains only the runs whose
    seed is i modulo n, waits for the other shards' runs where a stage needs them, and writes no
    report (returns None); a final call without a shard reuses every record and writes it.
    """
    index, count = shard
    if not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count):
        raise InputError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    if preset.protocol is None:
        raise InputError(f"preset {preset.name} has no 'protocol' section; use run_compare")
    out_dir = Path(out_dir)
    final_seeds = seeds or preset.seeds
    threshold = failure_threshold(preset) if preset.protocol.choice == "fit" else math.inf
    waiting = False
    while True:
        survey = _Survey(preset, out_dir, final_seeds, threshold)
        mine = [r for r in survey.todo if r.seed % count == index]
        if not survey.todo:
            break
        if not mine:
            if not waiting:
                log(f"compare: waiting for {len(survey.todo)} run(s) of the other shards (seeds not {index} "
                    f"modulo {count}); if no other shard is running, start it or run without --shard")
            waiting = True
            time.sleep(wait_s)
            continue
        waiting = False
        display = CompareProgress(len(mine), 0, sum(r.run.train.steps for r in mine), log=log, interactive=progress)
        try:
            for planned in mine:
                label = f"{planned.variant['name']} {rate_label(planned.rate)}"
                train_variant(planned.run, label, planned.seed, device, display, force)
        finally:
            display.close()
    if count > 1:
        return None
    results = protocol_results(preset, survey, command, device, log)
    write_protocol_report(results, out_dir)
    return results


def failure_threshold(preset: ComparePreset) -> float:
    """The loss above which a run of `preset` has failed: the unigram entropy of its training split."""
    first = rate_run(preset, preset.variants[0], preset.protocol.lr_grid[0], 0, Path("unused"))
    data = prepare_data(first.data)
    return unigram_entropy(data.train_tokens, data.tokenizer.vocab_size)


def _tail_train_loss(record: dict, steps: int) -> float | None:
    """A run's mean logged training loss over its last 10 % of steps (None without such a log)."""
    tail = [loss for step, loss in record.get("train_curve") or [] if step > 0.9 * steps]
    return sum(tail) / len(tail) if tail else None


def protocol_results(preset: ComparePreset, survey: _Survey, command: str, device: str, log=print) -> dict:
    """The results dict `write_protocol_report` documents, from a finished survey, with the cost measurement
    (`measure_costs`) of each variant's final runs, made now, in this process."""
    variants = []
    first = rate_run(preset, preset.variants[0], preset.protocol.lr_grid[0], 0, Path("unused"))
    for index, (spec, search) in enumerate(zip(preset.variants, survey.searches)):
        grid = [{"lr": rate, "mean_val_loss": search.mean_val[rate],
                 "val_losses": [survey.run(index, rate, s).record["final_val_loss"]
                                for s in range(preset.protocol.grid_seeds)]} for rate in search.rates]
        runs = [{**survey.run(index, search.chosen, s).record, "lr": search.chosen} for s in survey.seeds_of(index)]
        for run in runs:
            run["tail_train_loss"] = _tail_train_loss(run, first.train.steps)
        variants.append({"name": variant_name(spec), **spec, "primary": preset.protocol.is_primary(spec),
                         "grid": grid, "chosen_lr": search.chosen, "edge": search.edge,
                         "extended": list(search.extended), "fit": None if search.fit is None else search.fit.to_dict(),
                         "runs": runs})
    data = prepare_data(first.data)
    vocab_size = data.tokenizer.vocab_size  # the token cache's: reads no documents
    for variant, spec in zip(variants, preset.variants):
        config = rate_run(preset, spec, first.train.lr, 0, Path("unused")).model.with_vocab_size(vocab_size)
        with torch.device("meta"):  # the count needs shapes only
            variant["parameters"] = sum(p.numel() for p in AttnResLM(config).parameters())
    trained = {v["name"]: survey.run(i, s.chosen, survey.seeds_of(i)[0]).run
               for i, (v, s) in enumerate(zip(variants, survey.searches))}
    cost = measure_costs(trained, vocab_size, preset.cost, device, log=log)
    return {
        "preset": preset.name, "description": preset.description, "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(torch.device(device)),
        "code_path": {"routing_impl": first.train.routing_impl,
                      "routing": resolve_impl(first.train.routing_impl, torch.device(device)),
                      "precision": first.train.precision},
        "protocol": {**preset.protocol.to_dict(), "final_seeds": survey.final_seeds,
                     **({"failure_threshold": survey.threshold} if math.isfinite(survey.threshold) else {})},
        "tokens": {"train_split": int(len(data.train_tokens)), "per_run": first.train.steps * first.train.batch_size
                   * first.train.seq_len},
        "settings": {"model": preset.run.get("model", {}), "data": first.data.to_dict(),
                     "train": {k: v for k, v in preset.run.get("train", {}).items() if k not in ("lr", "min_lr")},
                     "min_lr_ratio": first.train.min_lr / first.train.lr},
        "variants": variants,
        "cost": cost,
    }
