"""TrainConfig: optimisation, schedule, precision, evaluation, checkpoint and parallelism settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from attnres.common.checks import check_bool, check_choice, check_int, check_positive_number, is_number
from attnres.common.errors import InputError
from attnres.common.precision import PRECISIONS
from attnres.distributed.env import DistributedEnv
from attnres.distributed.pipeline_layout import PipelineConfigError, PipelineSettings
from attnres.distributed.wrapper import PARALLEL_MODES as WRAPPED_MODES
from attnres.distributed.wrapper import StepSettings
from attnres.routing import IMPLS
from attnres.train.stability import (DEFAULT_GRAD_SPIKE_RATIO, DEFAULT_LOSS_SPIKE_FLOOR, DEFAULT_LOSS_SPIKE_MADS,
                                     DEFAULT_WINDOW, StabilityMonitor, check_stability_settings)

SCHEDULES = ("cosine", "wsd", "constant")
QUERY_INITS = ("zero", "normal")
PARALLEL_MODES = ("auto", *WRAPPED_MODES)


class TrainConfigError(InputError):
    """An invalid training setting; the message names the field and the allowed values."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train. Tokens per optimizer step = batch_size * grad_accum * seq_len.

    schedule: "cosine" (linear warm-up, cosine to min_lr), "wsd" (warm-up, stable, linear decay to
    min_lr over the last `decay_fraction` of steps) or "constant" (warm-up, then lr).
    routing_lr_mult scales the learning rate of router queries, key gains and gates.
    expert_balance_rate: how far each step moves a mixture-of-experts router's score-correction
    bias towards balanced expert loads (DeepSeek-V3's auxiliary-loss-free update, gamma; 0: off;
    attnres.model.moe_balance). It acts only where the model's `moe.score_bias` is true.
    precision "bf16" = fp32 master weights with bf16 autocast; "fp32" = no autocast.
    eval_batches=None evaluates on the whole validation split. diagnostics_every=N logs routing
    statistics (max weight, entropy, effective sources by router; hidden RMS and gradient RMS by
    depth) on `diagnostics_batches` held-out batches every N steps (None: never). activation_checkpointing recomputes
    each sub-layer in backward (less memory, about one more forward of compute).
    routing_impl (one of `attnres.routing.IMPLS`, those the variant takes) and routing_chunk_size
    (per-sub-layer variants: routers per chunk of two-phase routing, None: round(sqrt(routers)))
    choose how routing is computed, never what (docs/explanation/fast-paths.md): a run may resume
    with others, and checkpoints do not record them.
    query_init "normal" re-draws router queries from N(0, 0.02) at the start of a run (what public
    research code does by accident; both papers initialise them to zero, the default).
    parallel (under torchrun; see docs/how-to/scale-out.md): "ddp" (DistributedDataParallel), "fsdp"
    (FSDP2: parameters, gradients and optimizer state sharded), "none" (one process), or "auto"
    (ddp with more than one process, else none). batch_size stays the global batch of a
    micro-step: each of W ranks trains on batch_size / W of its rows. "pipeline" cuts the model
    into stages over the ranks instead (settings in `pipeline`: attnres.distributed's
    PipelineSettings, see docs/explanation/pipeline.md): fp32 only, grad_accum 1, no compile, batch_size a multiple of
    pipeline.num_microbatches.
    stability_window, loss_spike_mads, loss_spike_floor, grad_spike_ratio: how divergence events are
    counted (attnres.train.stability; they change nothing about training): a loss spike is a loss
    above median + max(loss_spike_mads * MAD, loss_spike_floor) of the previous stability_window
    steps' losses, a gradient-norm spike a pre-clip norm above grad_spike_ratio x their median norm.
    """

    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    seq_len: int = 256
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    schedule: str = "cosine"
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float | None = 1.0
    routing_lr_mult: float = 1.0
    expert_balance_rate: float = 0.001
    query_init: str = "zero"
    precision: str = "bf16"
    compile: bool = False
    activation_checkpointing: bool = False
    routing_impl: str = "auto"
    routing_chunk_size: int | None = None
    seed: int = 0
    eval_every: int = 100
    eval_batches: int | None = 8
    log_every: int = 10
    diagnostics_every: int | None = None
    diagnostics_batches: int = 2
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    progress: bool = True
    tensorboard: bool = True
    parallel: str = "auto"
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    stability_window: int = DEFAULT_WINDOW
    loss_spike_mads: float = DEFAULT_LOSS_SPIKE_MADS
    loss_spike_floor: float = DEFAULT_LOSS_SPIKE_FLOOR
    grad_spike_ratio: float = DEFAULT_GRAD_SPIKE_RATIO

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "seq_len", "eval_every", "log_every",
                     "checkpoint_every", "keep_checkpoints"):
            check_int(getattr(self, name), f"TrainConfig.{name}", error=TrainConfigError)
        check_int(self.warmup_steps, "TrainConfig.warmup_steps", minimum=0, error=TrainConfigError)
        for name in ("eval_batches", "diagnostics_every"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), f"TrainConfig.{name}", error=TrainConfigError)
        check_int(self.diagnostics_batches, "TrainConfig.diagnostics_batches", error=TrainConfigError)
        for name in ("lr", "routing_lr_mult"):
            check_positive_number(getattr(self, name), f"TrainConfig.{name}", error=TrainConfigError)
        if not is_number(self.min_lr) or not 0 <= self.min_lr <= self.lr:
            raise TrainConfigError(f"TrainConfig.min_lr must be a number in [0, lr={self.lr}], got {self.min_lr!r}")
        if not is_number(self.expert_balance_rate) or not 0 <= self.expert_balance_rate < math.inf:
            raise TrainConfigError(f"TrainConfig.expert_balance_rate must be a number >= 0 (0: no balancing), "
                                   f"got {self.expert_balance_rate!r}")
        if not is_number(self.weight_decay) or not 0 <= self.weight_decay < math.inf:
            raise TrainConfigError(f"TrainConfig.weight_decay must be a number >= 0, got {self.weight_decay!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value < 1:
                raise TrainConfigError(f"TrainConfig.{name} must be a number in [0, 1), got {value!r}")
        if not is_number(self.decay_fraction) or not 0 < self.decay_fraction <= 1:
            raise TrainConfigError(f"TrainConfig.decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if self.grad_clip is not None:
            check_positive_number(self.grad_clip, "TrainConfig.grad_clip", error=TrainConfigError)
        check_int(self.routing_chunk_size, "TrainConfig.routing_chunk_size", allow_none=True, error=TrainConfigError)
        for name, choices in (("schedule", SCHEDULES), ("query_init", QUERY_INITS), ("parallel", PARALLEL_MODES),
                              ("precision", PRECISIONS), ("routing_impl", IMPLS)):
            check_choice(getattr(self, name), f"TrainConfig.{name}", choices, error=TrainConfigError)
        for name in ("compile", "activation_checkpointing", "progress", "tensorboard"):
            check_bool(getattr(self, name), f"TrainConfig.{name}", error=TrainConfigError, yaml=True)
        check_int(self.seed, "TrainConfig.seed", minimum=0, error=TrainConfigError)
        check_stability_settings(self.stability_window, self.loss_spike_mads, self.loss_spike_floor,
                                 self.grad_spike_ratio, prefix="TrainConfig.", error=TrainConfigError)
        object.__setattr__(self, "pipeline", _pipeline_settings(self.pipeline))
        if self.parallel == "pipeline":
            self._check_pipeline()

    def _check_pipeline(self) -> None:
        """What parallel='pipeline' does not support, refused by name (see docs/explanation/pipeline.md)."""
        if self.precision == "bf16":
            raise TrainConfigError(
                "TrainConfig.precision='bf16' is not supported with parallel='pipeline' (stage payloads travel in "
                "the fp32 parameter dtype, while bf16 autocast keeps some routing sources in bf16); set "
                "train.precision=fp32")
        if self.grad_accum != 1:
            raise TrainConfigError(
                f"TrainConfig.grad_accum={self.grad_accum} is not supported with parallel='pipeline' (the schedule "
                f"rescales all gradients every step); use grad_accum=1 and a larger batch_size split into more "
                f"pipeline.num_microbatches")
        if self.compile:
            raise TrainConfigError("TrainConfig.compile=true is not supported with parallel='pipeline'")
        micro = self.pipeline.num_microbatches
        if self.batch_size % micro:
            raise TrainConfigError(
                f"TrainConfig.batch_size={self.batch_size} must be divisible by TrainConfig.pipeline."
                f"num_microbatches={micro} with parallel='pipeline': each micro-batch has batch_size / "
                f"num_microbatches rows")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    def stability_monitor(self) -> StabilityMonitor:
        """A fresh counter of this run's divergence events (clipping at grad_clip, the spike settings)."""
        return StabilityMonitor(grad_clip=self.grad_clip, window=self.stability_window, mads=self.loss_spike_mads,
                                floor=self.loss_spike_floor, grad_ratio=self.grad_spike_ratio)

    def step_settings(self) -> StepSettings:
        """How one optimizer step runs (attnres.distributed's settings)."""
        return StepSettings(precision=self.precision, grad_accum=self.grad_accum, compile=self.compile,
                            batch_size=self.batch_size, seq_len=self.seq_len)


def resolve_parallel(cfg: TrainConfig, env: DistributedEnv | None) -> str:
    """The kind of parallelism of this run, "none", "ddp", "fsdp" or "pipeline": train.parallel with
    "auto" resolved (ddp when launched on more than one process, else none) and checked against the launch."""
    mode = cfg.parallel
    if mode == "auto":
        mode = "ddp" if env is not None and env.world_size > 1 else "none"
    if env is None and mode != "none":
        raise TrainConfigError(f"train.parallel={mode!r} needs a process group: launch with "
                               f"`torchrun --nproc_per_node=N -m attnres train ...`, or set train.parallel=none")
    if env is None:
        return mode
    if mode == "none" and env.world_size > 1:
        raise TrainConfigError(f"train.parallel='none' with {env.world_size} processes would train "
                               f"{env.world_size} copies side by side; use 'ddp', 'fsdp' or 'auto'")
    if mode == "pipeline":  # every rank takes whole batches; the micro-batch split is TrainConfig's check
        if env.world_size < 2:
            raise TrainConfigError("train.parallel='pipeline' needs at least 2 processes (each runs one or more "
                                   "stages); launch with `torchrun --nproc_per_node=N` with N >= 2")
        return mode
    if cfg.batch_size % env.world_size:
        raise TrainConfigError(f"train.batch_size={cfg.batch_size} (the global batch) must be divisible by the "
                               f"world size {env.world_size}: each rank takes batch_size / world_size rows")
    return mode


def pipeline_setting_error(error: PipelineConfigError, prefix: str = "train.pipeline.") -> TrainConfigError:
    """A pipeline error reworded for a run: its fields named as the run's config keys."""
    message = str(error)
    for owner in ("PipelineConfig.", "PipelineSettings."):
        message = message.replace(owner, prefix)
    return TrainConfigError(message)


def _pipeline_settings(value: PipelineSettings | dict | None) -> PipelineSettings:
    """`train.pipeline` from YAML (a mapping; unknown keys are errors), or the settings as given."""
    if isinstance(value, PipelineSettings):
        return value
    if value is None:
        return PipelineSettings()
    names = {f.name for f in fields(PipelineSettings)}
    if not isinstance(value, dict):
        raise TrainConfigError(f"TrainConfig.pipeline must be a mapping of {sorted(names)}, got {value!r}")
    unknown = sorted(set(value) - names, key=str)
    if unknown:
        raise TrainConfigError(f"unknown train.pipeline key(s) {unknown}; allowed: {sorted(names)}")
    try:
        return PipelineSettings(**value)
    except PipelineConfigError as error:
        raise pipeline_setting_error(error, "TrainConfig.pipeline.") from None
