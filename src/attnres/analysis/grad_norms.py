"""Gradient scale by depth: how strongly the loss pulls on each sub-layer's output."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from attnres.common.errors import InputError
from attnres.analysis.evaluating import evaluating
from attnres.model import AttnResLM


def collect_grad_norms(model: AttnResLM, batches: Iterable[torch.Tensor]) -> list[float]:
    """RMS of dLoss/d(delta_s) for each sub-layer output delta_s, s = 0 .. 2L-1 (even: attention, odd: MLP).

    Each (B, T) token-id batch is run in eval mode with labels = the ids. Loss is the *summed*
    next-token cross-entropy (the model's mean loss times its B * (T - 1) targets), so a value is
    the gradient of one token's loss terms, independent of batch size. The RMS is over the B, T - 1,
    D elements of positions 0 .. T-2 of every batch together (every predicting token counts once);
    the last position predicts nothing and its gradient is exactly 0, so it is left out. Batches
    with T < 2 have no targets and are skipped.

    Deltas are captured by wrapping `model.residual.after` on the instance and differentiated with
    `torch.autograd.grad`, so no parameter `.grad` is created or changed. A delta that does not
    require grad (frozen parameters) is replaced by an equal leaf that does, so every depth gets a
    value. The wrapper, the training flag and the parameters' grads are left as found, also when a
    forward raises.
    """
    residual = model.residual
    num_sublayers = 2 * len(model.layers)
    sum_sq = [0.0] * num_sublayers
    count = [0] * num_sublayers
    captured: list[tuple[int, torch.Tensor]] = []
    own = vars(residual).get("after")  # an instance attribute shadowing the method, if any
    original = residual.after

    def capture(s: int, state, delta: torch.Tensor) -> None:
        if not delta.requires_grad:
            delta = delta.detach().requires_grad_()
        captured.append((s, delta))
        return original(s, state, delta)

    residual.after = capture
    try:
        with evaluating(model, grad=True):
            for ids in batches:
                if ids.dim() != 2:
                    raise InputError(f"batches must have shape (batch, seq_len), got {tuple(ids.shape)}")
                targets = ids.shape[0] * (ids.shape[1] - 1)
                if targets <= 0:
                    continue
                captured.clear()
                loss = model(ids, labels=ids).loss * targets
                if [s for s, _ in captured] != list(range(num_sublayers)):
                    raise RuntimeError(f"expected sub-layer outputs 0 .. {num_sublayers - 1} in order, got "
                                       f"{[s for s, _ in captured]}")
                deltas = [d for _, d in captured]
                grads = torch.autograd.grad(loss, deltas, allow_unused=True)
                for s, (delta, grad) in enumerate(zip(deltas, grads)):
                    used = delta[:, :-1]
                    if grad is not None:
                        sum_sq[s] += float(grad[:, :-1].detach().double().pow(2).sum())
                    count[s] += used.numel()
                captured.clear()
    finally:
        captured.clear()
        if own is None:
            del residual.after
        else:
            residual.after = own

    if not any(count):
        raise InputError("collect_grad_norms needs at least one batch with seq_len >= 2")
    return [math.sqrt(total / n) for total, n in zip(sum_sq, count)]
