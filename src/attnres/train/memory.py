"""Memory of one training step: activations saved for backward, and the peak."""

from __future__ import annotations

import torch
from torch import nn

from attnres.common.precision import autocast
from attnres.model.memory_need import training_state_bytes


def measure_step_memory(model: nn.Module, batch: torch.Tensor, precision: str) -> dict:
    """Run one forward/backward on `batch` (B, T) under `precision` ("bf16" autocast or "fp32") and report bytes.

    activation_bytes: distinct storages saved for backward during the forward pass (what the
    residual scheme changes); peak_bytes: on CUDA the allocator's peak, elsewhere an estimate = fp32
    weights, gradients and AdamW moments (attnres.model.memory_need.training_state_bytes) +
    activations. Gradients are cleared.
    """
    seen: dict[tuple, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:  # parameters are not activations
            seen[(storage.data_ptr(), tensor.device)] = storage.nbytes()
        return tensor

    device = batch.device
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast(device, precision):
            loss = model(batch, labels=batch).loss
    activation = sum(seen.values())
    loss.backward()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:  # the training state as every size check counts it, plus the activations
        peak = training_state_bytes(sum(p.numel() for p in model.parameters())) + activation
    model.zero_grad(set_to_none=True)
    return {"activation_bytes": int(activation), "peak_bytes": int(peak), "parameter_bytes": int(params)}
