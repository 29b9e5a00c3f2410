"""Data parallelism: each rank's rows of every global batch, DDP / FSDP2 wrapping, gradient sync, clipping.

Semantics: the global batch of one micro-step is the same on every rank, and every rank keeps its
own contiguous block of B / W rows. Every row has the same number of targets, so the mean of the W
rank losses is the single-process loss, and the averaged gradient (DDP's all-reduce, FSDP's
reduce-scatter) is the single-process gradient. One process is the case W = 1 with no wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from attnres.common.precision import autocast
from attnres.common.toolchain import require_inductor_compiler
from attnres.distributed.env import DistributedEnv, all_reduce_mean
from attnres.distributed.wrapper import ParallelModel, StepSettings
from attnres.model import AttnResLM


def local_rows(batch: torch.Tensor, env: DistributedEnv | None) -> torch.Tensor:
    """This rank's block of a global (B, T) batch: rows [r B/W, (r+1) B/W) -> (B/W, T).

    The whole batch in a single process. B must be divisible by W."""
    if env is None:
        return batch
    per_rank = batch.shape[0] // env.world_size
    return batch[env.rank * per_rank:(env.rank + 1) * per_rank]


@dataclass
class DataParallel(ParallelModel):
    """One process (mode "none"), DDP or FSDP2 on this rank.

    forward: what a micro-step calls (the DDP wrapper, else `model`), compiled when step.compile.
    replicated: parameters FSDP cannot shard (0-dim gates), kept whole on every rank;
    `finish_gradients` averages their gradients.
    """

    forward: nn.Module | None = None
    env: DistributedEnv | None = None
    step: StepSettings = field(default_factory=StepSettings)
    replicated: list[nn.Parameter] = field(default_factory=list)

    def __post_init__(self) -> None:
        module = self.model if self.forward is None else self.forward
        if self.step.compile and torch.device(self.device).type == "cpu":
            require_inductor_compiler("train.compile=true: the training step", "set train.compile=false")
        self.forward = torch.compile(module) if self.step.compile else module

    def local_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global (B, T) batch (`local_rows`)."""
        return local_rows(batch, self.env)

    def train_step(self, next_batch: Callable[[], torch.Tensor]) -> float:
        """step.grad_accum micro-steps, each on this rank's rows of next_batch(), under the step's autocast.

        Gradients are left synchronised in .grad (DDP's all-reduce on the last micro-step, FSDP's
        reduce-scatter, `finish_gradients`). Returns the global batch's mean loss, the same on every rank."""
        accum = self.step.grad_accum
        loss_sum = 0.0
        for micro in range(accum):
            batch = self.local_rows(next_batch()).to(self.device)
            with self.gradient_sync(micro == accum - 1):
                with autocast(self.device, self.step.precision):
                    loss = self.forward(batch, labels=batch).loss / accum
                loss.backward()
            loss_sum += float(loss.detach())
        self.finish_gradients()
        return all_reduce_mean(loss_sum)

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
        """`ParallelModel.clip_grad_norm`. DDP's gradients are equal on every rank after its all-reduce,
        so the local norm is global. FSDP's are DTensor shards: torch computes their norm over the full
        tensors, but only over DTensors or plain tensors, not a mix, so a mix (FSDP with replicated
        gates) is measured in two parts and combined."""
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

    def inference_context(self):
        """FSDP's sub-layer weights gather in bf16 under bf16 training: autocast lets them meet the fp32
        stream outside the training step."""
        return autocast(self.device, self.step.precision) if self.mode == "fsdp" else nullcontext()


def wrap_data_parallel(model: AttnResLM, mode: str, env: DistributedEnv | None, step: StepSettings) -> DataParallel:
    """Prepare `model` (already on its device, weights final) for mode "none", "ddp" or "fsdp".

    ddp: DistributedDataParallel (parameters replicated, gradients all-reduced).
    fsdp: FSDP2 `fully_shard` on each sub-layer (its pre-norm with its attention or MLP: the model
    calls `attention_delta` / `mlp_delta`, not the layer's forward, and a unit per sub-layer gathers
    exactly the weights each call needs), then on the root, which holds the embedding, the tied
    head (one parameter, one shard), the final norm and the small routing parameters. Under bf16
    the sub-layer units gather and compute in bf16 and reduce gradients in fp32; the root keeps fp32
    so the residual stream and block sums accumulate in fp32, as single-process autocast does.
    Activation checkpointing is the model's own (per sub-layer).
    """
    device = env.device if env is not None else next(model.parameters()).device
    if mode == "none":
        return DataParallel(model, "none", device, env=env, step=step)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [env.device.index] if env.device.type == "cuda" else None
        return DataParallel(model, "ddp", device, DistributedDataParallel(model, device_ids=device_ids), env, step)
    if mode != "fsdp":
        raise ValueError(f"unknown data-parallel mode {mode!r}; expected 'none', 'ddp' or 'fsdp'")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    # cast_forward_inputs=False: the pre-norm sees the fp32 stream, as under single-process autocast.
    low = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    sublayer_policy = low if step.precision == "bf16" else MixedPrecisionPolicy()
    for layer in model.layers:
        fully_shard([layer.input_layernorm, layer.self_attn], mesh=mesh, mp_policy=sublayer_policy)
        fully_shard([layer.post_attention_layernorm, layer.mlp], mesh=mesh, mp_policy=sublayer_policy)
    replicated = [p for p in model.parameters() if p.dim() == 0]  # fully_shard refuses scalars
    fully_shard(model, mesh=mesh, ignored_params=set(replicated) or None)
    return DataParallel(model, "fsdp", device, None, env, step, replicated)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor  # only under FSDP: a slow first import

    return isinstance(tensor, DTensor)
