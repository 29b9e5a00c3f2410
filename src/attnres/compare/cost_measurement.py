"""The cost measurement of `attnres compare`: every variant's training step and step memory, in one process.

Training runs are made one after another, so their wall times mix the cost of a variant with what
else the machine was doing at the time. After training, this module builds a fresh model of each
variant's configuration (weights from one seed, the run's batch shape and precision) and times
their training steps the way `attnres bench` does: `run_interleaved` (every variant once per round,
standard first, warm-up rounds dropped) over `attnres.train.step_cost.VariantRunner`. Ratios to
standard, their spread and the noise verdict are computed from the raw samples by the report
(`attnres.report.compare_summary`), so results.json holds the measurement, not a conclusion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone

import torch

from attnres.common.checks import check_int, check_positive_number
from attnres.common.machine import machine_info
from attnres.train.timing import Task, run_interleaved
from attnres.report.compare_summary import BASELINE
from attnres.routing import resolve_impl
from attnres.train.step_cost import VariantRunner, device_sync, release_memory
from attnres.train.run_config import RunConfig, RunConfigError

MIN_REPEATS = 5  # the fewest rounds whose median has a distribution-free interval of 90 % or more


@dataclass(frozen=True)
class CostSettings:
    """The preset's `cost:` section: how the cost measurement after training runs.

    repeats: measured rounds (each times every variant's training step once; more rounds narrow the
    interval of the median ratio); warmup: discarded rounds first; noise_threshold: a step-time
    ratio whose 90 % interval (`attnres.train.timing.ratio_spread`) is wider than this fraction of
    the ratio is reported as too noisy to quote (0.25: wider than that, the interval cannot tell a
    1.05x cost from a 1.25x one); seed: of
    the fresh models' weights and the random token batch.
    """

    repeats: int = 5
    warmup: int = 2
    noise_threshold: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        check_int(self.repeats, "cost.repeats", minimum=MIN_REPEATS, error=RunConfigError,
                  why=" (the report prints the median over rounds and its 90% interval)")
        check_int(self.warmup, "cost.warmup", minimum=0, error=RunConfigError)
        check_positive_number(self.noise_threshold, "cost.noise_threshold", error=RunConfigError)
        check_int(self.seed, "cost.seed", minimum=0, error=RunConfigError)

    @classmethod
    def from_dict(cls, values: dict | None, where: str = "cost") -> "CostSettings":
        """From a preset's `cost:` mapping (None: every default); unknown keys are a RunConfigError."""
        if values is not None and not isinstance(values, dict):
            raise RunConfigError(f"{where} must be a mapping of repeats, warmup, noise_threshold, seed; got {values!r}")
        values = dict(values or {})
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(allowed), key=str)
        if unknown:
            raise RunConfigError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")
        return cls(**values)

    def to_dict(self) -> dict:
        """Every field, for results.json."""
        return asdict(self)


def measure_costs(runs: dict[str, RunConfig], vocab_size: int, settings: CostSettings,
                  device: str | torch.device = "cpu", log: Callable[[str], object] | None = None) -> dict:
    """Time the training step of a fresh model of every run's configuration, interleaved, and measure its memory.

    runs: variant name -> the RunConfig one of its runs trained (model, precision, batch shape and
    activation checkpointing are taken from it); exactly one has residual `standard`. vocab_size:
    the tokenizer's, as the trained models had. Every model gets the same weights where they share
    them (`settings.seed`) and the same random (batch_size, seq_len) token batch.

    Returns {"settings": {**settings, "batch_size", "seq_len", "precision", "routing_impl", "routing",
    "device"}, "created", "machine": `machine_info`, "variants": {name: {"model": ModelConfig dict,
    "parameters", "train_step_s": {"median_s", "samples_s"} (one sample per measured round, rounds in
    the same order for every variant), "memory": `VariantRunner.memory()`}}}, variants with standard first.
    """
    device = torch.device(device)
    names = sorted(runs, key=lambda name: runs[name].model.residual != BASELINE)  # standard first
    if [runs[n].model.residual for n in names].count(BASELINE) != 1:
        raise RunConfigError(f"the cost measurement needs exactly one {BASELINE!r} run, got {names}")
    base = runs[names[0]].train
    generator = torch.Generator().manual_seed(settings.seed)
    batch = torch.randint(0, vocab_size, (base.batch_size, base.seq_len), generator=generator).to(device)
    runners = {}
    for name in names:
        train = runs[name].train
        runner = VariantRunner(runs[name].model.with_vocab_size(vocab_size), device, train.precision, batch, None,
                               settings.seed, train.routing_impl, train.routing_chunk_size)
        runner.model.activation_checkpointing = runs[name].train.activation_checkpointing  # as it trained
        runners[name] = runner
    timings = run_interleaved([Task(name, runners[name].train_step) for name in names], settings.repeats,
                              settings.warmup, sync=device_sync(device), log=log, label="cost: ")
    routing_impl = base.routing_impl
    variants = {name: {"model": runners[name].config.to_dict(), "parameters": runners[name].parameters(),
                       "train_step_s": timings[name].to_dict(), "memory": runners[name].memory()}
                for name in names}
    del runners
    release_memory(device)
    return {"settings": {**settings.to_dict(), "batch_size": base.batch_size, "seq_len": base.seq_len,
                         "precision": base.precision, "routing_impl": routing_impl,
                         "routing": resolve_impl(routing_impl, device), "device": str(device)},
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(device),
            "variants": variants}
