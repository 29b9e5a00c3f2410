"""Training: configs, AdamW groups, schedules, the trainer, evaluation, metrics.

Checkpoints are `attnres.checkpoint`'s format, written through `attnres.distributed.Checkpointer`;
their errors and readers are re-exported here for convenience.
"""

from attnres.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint
from attnres.train.train_config import TrainConfig, TrainConfigError
from attnres.train.evaluate import evaluate, evaluate_checkpoint
from attnres.train.run_config import RunConfig, RunConfigError, load_run_config
from attnres.train.trainer import Trainer, TrainingError, TrainResult, train

__all__ = ["CheckpointError", "RunConfig", "RunConfigError", "TrainConfig", "TrainConfigError", "TrainResult",
           "Trainer", "TrainingError", "evaluate", "evaluate_checkpoint", "latest_checkpoint", "load_run_config",
           "read_checkpoint", "train"]
