"""A model looked at rather than trained: eval mode for a block of code, hooks removed and the training
flag restored after it, also when it raises. Shared by evaluation and every depth statistic."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def evaluating(model: nn.Module, *, grad: bool = False) -> Iterator[list]:
    """`model` in eval mode, with gradients only if `grad`, for the with-block.

    Yields a list for the hook handles (anything with `.remove()`) the block registers; on exit each is
    removed and the model's training flag restored, also when the block raises.
    """
    was_training = model.training
    handles: list = []
    model.eval()
    try:
        with torch.set_grad_enabled(grad):
            yield handles
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
