"""wrap_model: a plain model, the world and a few settings in; a `ParallelModel` for this rank out."""

from __future__ import annotations

from attnres.common.errors import InputError
from attnres.distributed.data_parallel import wrap_data_parallel
from attnres.distributed.env import DistributedEnv
from attnres.distributed.pipeline_layout import PipelineConfig, PipelineSettings
from attnres.distributed.pipeline_train import wrap_pipeline
from attnres.distributed.wrapper import PARALLEL_MODES, ParallelModel, StepSettings
from attnres.model import AttnResLM


def wrap_model(model: AttnResLM, mode: str, env: DistributedEnv | None, step: StepSettings,
               pipeline: PipelineSettings | None = None) -> ParallelModel:
    """Set up `model` (on its device, weights final, identical on every rank) for training in `mode`:
    "none" (one process), "ddp", "fsdp" (see `wrap_data_parallel`) or "pipeline" (the stages of
    `pipeline` over every rank, micro-batches of step.batch_size / num_microbatches rows of
    step.seq_len tokens, see `wrap_pipeline`; step must be fp32 with grad_accum 1). A collective in a
    process group; PipelineConfigError for a pipeline split that does not fit the model or the world."""
    if mode == "pipeline":
        return wrap_pipeline(model, pipeline_config(step, pipeline))
    if mode not in PARALLEL_MODES:
        raise InputError(f"wrap_model: mode must be one of {list(PARALLEL_MODES)}, got {mode!r}")
    return wrap_data_parallel(model, mode, env, step)


def pipeline_config(step: StepSettings, pipeline: PipelineSettings | None = None) -> PipelineConfig:
    """The pipeline of `pipeline`'s settings for training steps `step`: micro-batches of
    step.batch_size / num_microbatches rows of step.seq_len tokens."""
    settings = pipeline or PipelineSettings()
    return settings.with_shapes(step.batch_size // settings.num_microbatches, step.seq_len)
