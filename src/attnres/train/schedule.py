"""Learning-rate schedules as a factor of each parameter group's base learning rate."""

from __future__ import annotations

import math

import torch

from attnres.train.train_config import TrainConfig


def lr_factor(step: int, config: TrainConfig) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-based); ends at min_lr / lr."""
    floor = config.min_lr / config.lr
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    if config.schedule == "cosine":
        span = max(1, config.steps - config.warmup_steps - 1)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_steps = max(1, round(config.decay_fraction * config.steps))
    decay_start = max(config.warmup_steps, config.steps - decay_steps)
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start + 1) / max(1, config.steps - decay_start))
    return 1.0 - (1.0 - floor) * progress


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig,
                    step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying `lr_factor` to every group (so group lr multipliers are kept).

    step: optimizer steps already taken (a resumed run's); above 0 the groups' `initial_lr` are the
    base rates and each group's lr is set to the rate of step `step` under `config`'s schedule."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config), last_epoch=step - 1)
