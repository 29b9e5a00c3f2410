"""AdamW with parameter groups: decayed matrices, undecayed gains and embeddings, routing."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from attnres.model import AttnResLM
from attnres.train.train_config import TrainConfig


def parameter_groups(model: AttnResLM,
                     only: Collection[str] | None = None) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Split parameters into "decay" (linear weights), "no_decay" (norm gains, embeddings, tied
    head, and what a module lists in `no_weight_decay`, e.g. Kimi Delta Attention's decay rates
    A_log) and "routing" (router queries, key gains, gates). Shared (tied) tensors appear once.

    only: names (as in model.named_parameters()) to keep, e.g. a pipeline stage's own; None keeps all."""
    undecayed_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    undecayed_ids |= {id(getattr(m, name)) for m in model.modules() for name in getattr(m, "no_weight_decay", ())}
    routing_ids = {id(param) for _, param in model.routing_parameters()}
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {"decay": [], "no_decay": [], "routing": []}
    for name, param in model.named_parameters():  # named_parameters yields a tied tensor once
        if not param.requires_grad or (only is not None and name not in only):
            continue
        if id(param) in routing_ids:
            groups["routing"].append((name, param))
        elif param.dim() < 2 or id(param) in undecayed_ids:
            groups["no_decay"].append((name, param))
        else:
            groups["decay"].append((name, param))
    return groups


def build_optimizer(model: AttnResLM, config: TrainConfig, only: Collection[str] | None = None) -> torch.optim.AdamW:
    """AdamW over fp32 parameters: weight decay only on "decay"; routing at lr * routing_lr_mult.

    only: train just these parameter names (a pipeline rank's stages); None: every parameter."""
    groups = parameter_groups(model, None if only is None else set(only))
    settings = {"decay": (config.lr, config.weight_decay), "no_decay": (config.lr, 0.0),
                "routing": (config.lr * config.routing_lr_mult, 0.0)}
    param_groups = [{"params": [p for _, p in groups[key]], "lr": lr, "weight_decay": wd, "name": key}
                    for key, (lr, wd) in settings.items() if groups[key]]
    return adamw(param_groups, betas=(config.beta1, config.beta2))


def adamw(params, **options) -> torch.optim.AdamW:
    """torch.optim.AdamW with its fused kernel when every parameter is a plain CPU or CUDA tensor,
    else the multi-tensor (foreach) update (e.g. FSDP's sharded DTensors). Same update rule.

    PyTorch defaults to foreach on CUDA and to a per-tensor Python loop on CPU; on 2 CPU cores the
    fused kernel steps a 24 x 256 model in 25 ms against 82 ms for the loop, which also stops
    charging routed models for their many tiny router vectors (2 per router).
    params: an iterable of parameters or of parameter-group dicts, as torch.optim takes."""
    groups = list(params)
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    fused = all(type(p) in (torch.Tensor, nn.Parameter) and p.device.type in ("cpu", "cuda") for p in tensors)
    return torch.optim.AdamW(groups, **({"fused": True} if fused else {"foreach": True}), **options)
