"""TrainConfig: optimisation, schedule, precision, evaluation and checkpoint settings."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("cosine", "wsd", "constant")
QUERY_INITS = ("zero", "normal")
PRECISIONS = ("bf16", "fp32")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")


class TrainConfigError(ValueError):
    """An invalid training setting; the message names the field and the allowed values."""


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
    micro-step: each of W ranks trains on batch_size / W of its rows.
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

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainConfigError(f"TrainConfig.{name} must be a positive integer, got {value!r}")


def _positive_number(name: str, value: object) -> None:
    if not _is_number(value) or not value > 0:
        raise TrainConfigError(f"TrainConfig.{name} must be a positive number, got {value!r}")
