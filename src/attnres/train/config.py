"""TrainConfig: optimisation, schedule, precision, evaluation and checkpoint settings."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from attnres.distributed.pipeline_layout import PipelineConfig, PipelineConfigError

SCHEDULES = ("cosine", "wsd", "constant")
QUERY_INITS = ("zero", "normal")
PRECISIONS = ("bf16", "fp32")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp", "pipeline")


class TrainConfigError(ValueError):
    """An invalid training setting; the message names the field and the allowed values."""


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """`train.pipeline`: how `parallel: pipeline` cuts the model into stages (docs/pipeline.md).

    The fields of `attnres.distributed.pipeline_layout.PipelineConfig` that a run chooses; the
    shapes that travel come from the run: microbatch_size = train.batch_size / num_microbatches,
    seq_len = train.seq_len. schedule: "gpipe", "1f1b" or "interleaved1f1b"; stages_per_rank (V):
    1 except for "interleaved1f1b"; layers_per_stage: decoder layers of each of the P x V stages,
    or None for an even split; allow_partial_blocks: let a stage boundary cut a block; cache: the
    cross-stage source cache.
    """

    schedule: str = "1f1b"
    stages_per_rank: int = 1
    num_microbatches: int = 4
    cache: bool = True
    layers_per_stage: tuple[int, ...] | None = None
    allow_partial_blocks: bool = False

    def __post_init__(self) -> None:
        if self.layers_per_stage is not None:
            if not isinstance(self.layers_per_stage, (list, tuple)):
                raise TrainConfigError(f"TrainConfig.pipeline.layers_per_stage must be a list of layer counts "
                                       f"(one per stage) or null, got {self.layers_per_stage!r}")
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))  # YAML gives a list
        try:  # the library's own rules, so a run and build_pipeline cannot disagree on what is valid
            self.to_pipeline_config(microbatch_size=1, seq_len=1)
        except PipelineConfigError as error:
            raise pipeline_setting_error(error, "TrainConfig.pipeline.") from None

    def to_pipeline_config(self, microbatch_size: int, seq_len: int) -> PipelineConfig:
        """The library's PipelineConfig: these settings with micro-batches of (microbatch_size, seq_len) tokens."""
        return PipelineConfig(schedule=self.schedule, stages_per_rank=self.stages_per_rank,
                              num_microbatches=self.num_microbatches, microbatch_size=microbatch_size,
                              seq_len=seq_len, layers_per_stage=self.layers_per_stage,
                              allow_partial_blocks=self.allow_partial_blocks, cache=self.cache)

    @classmethod
    def from_value(cls, value: "PipelineSettings | dict | None") -> "PipelineSettings":
        """The settings from a `train.pipeline` mapping (unknown keys are errors), or as given."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise TrainConfigError(f"TrainConfig.pipeline must be a mapping of {sorted(_names(cls))}, got {value!r}")
        unknown = sorted(set(value) - _names(cls))
        if unknown:
            raise TrainConfigError(f"unknown train.pipeline key(s) {unknown}; allowed: {sorted(_names(cls))}")
        return cls(**value)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train. Tokens per optimizer step = batch_size * grad_accum * seq_len.

    schedule: "cosine" (linear warm-up, cosine to min_lr), "wsd" (warm-up, stable, linear decay to
    min_lr over the last `decay_fraction` of steps) or "constant" (warm-up, then lr).
    routing_lr_mult scales the learning rate of router queries, key gains and gates.
    precision "bf16" = fp32 master weights with bf16 autocast; "fp32" = no autocast.
    eval_batches=None evaluates on the whole validation split. diagnostics_every=N logs routing
    statistics (max weight, entropy, effective sources by router; hidden RMS and gradient RMS by
    depth) on `diagnostics_batches` held-out batches every N steps (None: never). activation_checkpointing recomputes
    each sub-layer in backward (less memory, about one more forward of compute).
    query_init "normal" re-draws router queries from N(0, 0.02) at the start of a run (what public
    research code does by accident; both papers initialise them to zero, the default).
    parallel (under torchrun; see docs/distributed.md): "ddp" (DistributedDataParallel), "fsdp"
    (FSDP2: parameters, gradients and optimizer state sharded), "none" (one process), or "auto"
    (ddp with more than one process, else none). batch_size stays the global batch of a
    micro-step: each of W ranks trains on batch_size / W of its rows. "pipeline" cuts the model
    into stages over the ranks instead (settings in `pipeline`, see PipelineSettings and
    docs/pipeline.md): fp32 only, grad_accum 1, no compile, batch_size a multiple of
    pipeline.num_microbatches.
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
    query_init: str = "zero"
    precision: str = "bf16"
    compile: bool = False
    activation_checkpointing: bool = False
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

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "seq_len", "eval_every", "log_every",
                     "checkpoint_every", "keep_checkpoints"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise TrainConfigError(f"TrainConfig.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.eval_batches is not None:
            _positive_int("eval_batches", self.eval_batches)
        if self.diagnostics_every is not None:
            _positive_int("diagnostics_every", self.diagnostics_every)
        _positive_int("diagnostics_batches", self.diagnostics_batches)
        for name in ("lr", "routing_lr_mult"):
            _positive_number(name, getattr(self, name))
        if not _is_number(self.min_lr) or not 0 <= self.min_lr <= self.lr:
            raise TrainConfigError(f"TrainConfig.min_lr must be a number in [0, lr={self.lr}], got {self.min_lr!r}")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            raise TrainConfigError(f"TrainConfig.weight_decay must be a number >= 0, got {self.weight_decay!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < 1:
                raise TrainConfigError(f"TrainConfig.{name} must be a number in [0, 1), got {value!r}")
        if not _is_number(self.decay_fraction) or not 0 < self.decay_fraction <= 1:
            raise TrainConfigError(f"TrainConfig.decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if self.grad_clip is not None:
            _positive_number("grad_clip", self.grad_clip)
        if self.schedule not in SCHEDULES:
            raise TrainConfigError(f"TrainConfig.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.query_init not in QUERY_INITS:
            raise TrainConfigError(f"TrainConfig.query_init must be one of {list(QUERY_INITS)}, got {self.query_init!r}")
        if self.parallel not in PARALLEL_MODES:
            raise TrainConfigError(f"TrainConfig.parallel must be one of {list(PARALLEL_MODES)}, got {self.parallel!r}")
        if self.precision not in PRECISIONS:
            raise TrainConfigError(f"TrainConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        for name in ("compile", "activation_checkpointing", "progress", "tensorboard"):
            if not isinstance(getattr(self, name), bool):
                raise TrainConfigError(f"TrainConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise TrainConfigError(f"TrainConfig.seed must be an integer >= 0, got {self.seed!r}")
        object.__setattr__(self, "pipeline", PipelineSettings.from_value(self.pipeline))
        if self.parallel == "pipeline":
            self._check_pipeline()

    def _check_pipeline(self) -> None:
        """What parallel='pipeline' does not support, refused by name (see docs/pipeline.md)."""
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


def pipeline_setting_error(error: PipelineConfigError, prefix: str = "train.pipeline.") -> TrainConfigError:
    """A PipelineConfig error reworded for a run: its fields named as the run's config keys."""
    return TrainConfigError(str(error).replace("PipelineConfig.", prefix))


def _names(kind) -> set[str]:
    return {f.name for f in fields(kind)}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainConfigError(f"TrainConfig.{name} must be a positive integer, got {value!r}")


def _positive_number(name: str, value: object) -> None:
    if not _is_number(value) or not value > 0:
        raise TrainConfigError(f"TrainConfig.{name} must be a positive number, got {value!r}")
