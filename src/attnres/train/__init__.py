"""Training: configs, AdamW groups, schedules, the loop, checkpoints, metrics."""

from attnres.train.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint
from attnres.train.config import TrainConfig, TrainConfigError
from attnres.train.evaluate import evaluate_checkpoint
from attnres.train.loop import TrainingError, TrainResult, evaluate, train
from attnres.train.run_config import RunConfig, RunConfigError, load_run_config

__all__ = ["CheckpointError", "RunConfig", "RunConfigError", "TrainConfig", "TrainConfigError", "TrainResult",
           "TrainingError", "evaluate", "evaluate_checkpoint", "latest_checkpoint", "load_run_config",
           "read_checkpoint", "train"]
