"""Evaluate a saved checkpoint on its run's held-out split."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from attnres.data import eval_batches, prepare_data
from attnres.train.checkpoint import read_checkpoint, restore_model
from attnres.train.loop import build_model, evaluate
from attnres.train.run_config import RunConfig


def evaluate_checkpoint(path: str | Path, max_batches: int | None = None, device: str = "cpu") -> dict:
    """Validation loss and perplexity of checkpoint `path` on the validation split of its own data.

    max_batches=None uses the run's train.eval_batches setting. Returns {"checkpoint", "step",
    "val_loss", "val_ppl", "val_tokens"}.
    """
    checkpoint = read_checkpoint(Path(path))
    run = RunConfig.from_dict(checkpoint.run_config)
    data = prepare_data(run.data)
    model = build_model(run, data.tokenizer.vocab_size, torch.device(device))
    restore_model(checkpoint, model)
    batches = [b.to(device) for b in eval_batches(data.val_tokens, run.train.seq_len, run.train.batch_size,
                                                  max_batches or run.train.eval_batches)]
    loss = evaluate(model, batches, run.train.precision)
    tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    return {"checkpoint": str(checkpoint.path), "step": checkpoint.step, "val_loss": loss,
            "val_ppl": math.exp(min(loss, 50.0)), "val_tokens": tokens}
