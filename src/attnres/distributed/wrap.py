"""wrap_model: a plain model, the world and a few settings in; a `ParallelModel` for this rank out."""

from __future__ import annotations

from attnres.distributed.data_parallel import wrap_data_parallel
from attnres.distributed.env import DistributedEnv
from attnres.distributed.pipeline_layout import PipelineConfig
from attnres.distributed.pipeline_train import wrap_pipeline
from attnres.distributed.wrapper import PARALLEL_MODES, ParallelModel, StepSettings
from attnres.model import AttnResLM


def wrap_model(model: AttnResLM, mode: str, env: DistributedEnv | None, step: StepSettings,
               pipeline: PipelineConfig | None = None) -> ParallelModel:
    """Set up `model` (on its device, weights final, identical on every rank) for training in `mode`:
    "none" (one process), "ddp", "fsdp" (see `wrap_data_parallel`) or "pipeline" (stages of
    `pipeline` over every rank, see `wrap_pipeline`; step must be fp32 with grad_accum 1).
    A collective in a process group."""
    if mode == "pipeline":
        if pipeline is None:
            raise ValueError("wrap_model: mode 'pipeline' needs a PipelineConfig")
        return wrap_pipeline(model, pipeline)
    if mode not in PARALLEL_MODES:
        raise ValueError(f"wrap_model: mode must be one of {list(PARALLEL_MODES)}, got {mode!r}")
    return wrap_data_parallel(model, mode, env, step)
