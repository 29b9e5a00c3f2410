"""Data parallelism for the training loop: which kind, each rank's rows, DDP / FSDP2 wrapping, clipping.

Semantics: `train.batch_size` is the GLOBAL batch of one micro-step. Every rank draws the same
global batch from the same loader and keeps its own contiguous block of B / W rows. Every row has
the same number of targets, so the mean of the W rank losses is the single-process loss, and the
averaged gradient (DDP's all-reduce, FSDP's reduce-scatter) is the single-process gradient.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from attnres.distributed.env import DistributedEnv
from attnres.model import AttnResLM
from attnres.train.config import TrainConfig, TrainConfigError


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


def local_rows(batch: torch.Tensor, env: DistributedEnv | None) -> torch.Tensor:
    """This rank's block of a global (B, T) batch: rows [r B/W, (r+1) B/W) -> (B/W, T).

    The whole batch in a single process. B must be divisible by W (see resolve_parallel)."""
    if env is None:
        return batch
    per_rank = batch.shape[0] // env.world_size
    return batch[env.rank * per_rank:(env.rank + 1) * per_rank]


@dataclass
class ParallelModel:
    """A model set up for training on one rank.

    model: the AttnResLM (under FSDP its parameters are sharded DTensors, in place): build the
    optimizer from it, evaluate it, checkpoint it. forward: what a training step calls (the DDP
    wrapper, else `model`). replicated: parameters FSDP cannot shard (0-dim gates), kept whole on
    every rank; `finish_gradients` averages their gradients.
    """

    model: AttnResLM
    forward: nn.Module
    mode: str = "none"
    replicated: list[nn.Parameter] = field(default_factory=list)

    # A method `train_step(next_batch) -> loss` in a wrapper whose schedule runs forward and backward
    # itself (the pipeline's); None: the loop runs its own micro-steps through `forward`.
    train_step = None

    def trained_parameter_names(self) -> list[str] | None:
        """Names of the parameters this rank's optimizer updates; None: all of them."""
        return None

    def sync_parameters(self) -> None:
        """Make every rank's whole model current before evaluating or saving (data parallel: it is)."""

    def step_metrics(self) -> dict:
        """Extra numbers of the last step for metrics.jsonl (none here)."""
        return {}

    def gradient_sync(self, enabled: bool):
        """Context for one micro-step's backward: DDP skips its all-reduce unless `enabled` (the last
        micro-step of an accumulation); FSDP reduce-scatters every micro-step so gradients stay
        sharded (less memory than holding whole gradients until the last one)."""
        if self.mode == "ddp" and not enabled:
            return self.forward.no_sync()
        return nullcontext()

    def finish_gradients(self) -> None:
        """Average the gradients FSDP does not reduce (the replicated parameters) over ranks."""
        for param in self.replicated:
            # Every rank runs the same graph, so a gradient is None on all ranks or on none.
            if param.grad is not None:
                dist.all_reduce(param.grad)  # SUM: gloo has no AVG
                param.grad.div_(dist.get_world_size())

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """Scale the model's gradients so their global L2 norm is at most max_norm (None: only
        measure); returns the norm before clipping, identical on every rank.

        DDP's gradients are equal on every rank after its all-reduce, so the local norm is global.
        FSDP's are DTensor shards: torch computes their norm over the full tensors, but only over
        DTensors or plain tensors, not a mix, so a mix (FSDP with replicated gates) is measured in
        two parts and combined."""
        grads = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = max_norm if max_norm is not None else float("inf")
        plain = [p for p in grads if not _is_dtensor(p.grad)] if self.mode == "fsdp" else grads
        if len(plain) in (0, len(grads)):
            return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
        sharded = [p for p in grads if _is_dtensor(p.grad)]
        parts = [torch.nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor(),
                 torch.nn.utils.get_total_norm([p.grad for p in plain])]
        total = float(torch.linalg.vector_norm(torch.stack([part.to(parts[0].device) for part in parts])))
        coef = min(1.0, max_norm / (total + 1e-6))  # as clip_grad_norm_ computes it
        if coef < 1.0:
            for p in grads:
                p.grad.mul_(coef)
        return total


def wrap_model(model: AttnResLM, cfg: TrainConfig, mode: str, env: DistributedEnv | None) -> ParallelModel:
    """Prepare `model` (already on env.device, weights final) for `mode` from resolve_parallel.

    ddp: DistributedDataParallel (parameters replicated, gradients all-reduced).
    fsdp: FSDP2 `fully_shard` on each sub-layer (its pre-norm with its attention or MLP: the model
    calls `attention_delta` / `mlp_delta`, not the layer's forward, and a unit per sub-layer gathers
    exactly the weights each call needs), then on the root, which holds the embedding, the tied
    head (one parameter, one shard), the final norm and the small routing parameters. Under bf16
    the sub-layer units gather and compute in bf16 and reduce gradients in fp32; the root keeps fp32
    so the residual stream and block sums accumulate in fp32, as single-process autocast does.
    Activation checkpointing is the model's own (per sub-layer, `train.activation_checkpointing`).
    pipeline: stages over the ranks (`attnres.distributed.pipeline_train.PipelineParallel`).
    """
    if mode == "none":
        return ParallelModel(model, model)
    if mode == "pipeline":
        from attnres.distributed.pipeline_train import wrap_pipeline

        return wrap_pipeline(model, cfg)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [env.device.index] if env.device.type == "cuda" else None
        return ParallelModel(model, DistributedDataParallel(model, device_ids=device_ids), "ddp")
    if mode != "fsdp":
        raise ValueError(f"unknown parallel mode {mode!r}; expected 'none', 'ddp' or 'fsdp'")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    # cast_forward_inputs=False: the pre-norm sees the fp32 stream, as under single-process autocast.
    low = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    sublayer_policy = low if cfg.precision == "bf16" else MixedPrecisionPolicy()
    for layer in model.layers:
        fully_shard([layer.input_layernorm, layer.self_attn], mesh=mesh, mp_policy=sublayer_policy)
        fully_shard([layer.post_attention_layernorm, layer.mlp], mesh=mesh, mp_policy=sublayer_policy)
    replicated = [p for p in model.parameters() if p.dim() == 0]  # fully_shard refuses scalars
    fully_shard(model, mesh=mesh, ignored_params=set(replicated) or None)
    return ParallelModel(model, model, "fsdp", replicated)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor  # only under FSDP: a slow first import

    return isinstance(tensor, DTensor)
