"""Evaluation: the mean loss of a model on batches, and of a saved checkpoint on its run's held-out split."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres.checkpoint import Checkpoint, CheckpointError, latest_checkpoint, read_checkpoint
from attnres.analysis.evaluating import evaluating
from attnres.common.checks import check_int
from attnres.common.machine import check_device
from attnres.common.precision import autocast
from attnres.data import DataConfig, PreparedData, eval_batches, prepare_data
from attnres.data.tokenizer import TOKENIZER_FILE
from attnres.distributed.checkpointer import restore_model
from attnres.model import AttnResLM
from attnres.train.starting_model import build_model, load_initial_weights
from attnres.train.run_config import RunConfig, RunConfigError, finetune_defaults, pretrained_model_fields


def evaluate(model: AttnResLM, batches: list[torch.Tensor], precision: str) -> float:
    """Mean next-token loss over `batches` (each (B, T)), every batch weighted by its tokens; the
    model's training flag is restored afterwards, also when a batch raises."""
    total, count = 0.0, 0
    with evaluating(model):
        for batch in batches:
            with autocast(batch.device, precision):
                loss = model(batch, labels=batch).loss
            tokens = batch.shape[0] * (batch.shape[1] - 1)
            total, count = total + float(loss) * tokens, count + tokens
    return total / max(count, 1)


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint with its run config, its run's prepared data and the restored model."""

    checkpoint: Checkpoint
    run: RunConfig
    data: PreparedData
    model: AttnResLM


RUNS_LISTED = 10  # run or checkpoint directories named in the message for a folder that is neither
CHECKPOINT_MARKERS = ("state.json", "model.safetensors", ".metadata")  # a (possibly broken) checkpoint has one


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory as given, or a run directory's latest checkpoint (`<run>/checkpoints/step_N`).

    Raises CheckpointError for a path that does not exist, for a run directory without checkpoints,
    for a folder that is neither (naming the run and checkpoint directories found inside it), and for a
    converted model's directory (config.json, no training state).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist (expected a checkpoint directory runs/X/checkpoints/step_N "
                              f"or a run directory)")
    if (path / "checkpoints").is_dir():  # a run directory: take its latest checkpoint
        latest = latest_checkpoint(path / "checkpoints")
        if latest is None:
            raise CheckpointError(f"run directory {path} has no complete checkpoint under {path / 'checkpoints'}")
        return latest.path
    if path.is_dir() and not any((path / name).exists() for name in CHECKPOINT_MARKERS):
        # Neither a checkpoint (not even a broken one) nor a run: say what is inside instead.
        found = _runs_and_checkpoints_inside(path)
        listing = "; inside it: " + ", ".join(map(str, found[:RUNS_LISTED])) if found else ""
        more = f" (and {len(found) - RUNS_LISTED} more)" if len(found) > RUNS_LISTED else ""
        raise CheckpointError(f"{path} is not a checkpoint directory (runs/X/checkpoints/step_N, with state.json) "
                              f"or a run directory (with checkpoints/){listing}{more}")
    if path.is_dir() and (path / "config.json").is_file() and not any(
            (path / name).exists() for name in ("state.json", "trainer.safetensors", ".metadata")):
        raise CheckpointError(f"{path} is a Hugging Face-format model (`attnres convert` output), not a training "
                              f"checkpoint (no state.json to name its run's held-out data); measure it with "
                              f"`attnres analyze {path} --data SOURCE` or `attnres lm-eval {path}`")
    return path


def _runs_and_checkpoints_inside(folder: Path, depth: int = 3) -> list[Path]:
    """Run directories (holding checkpoints/) and loose checkpoint directories (holding state.json) under
    `folder`, at most `depth` levels down, in name order; a run's own checkpoints are not listed again."""
    found: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (child / "checkpoints").is_dir() or (child / "state.json").is_file():
            found.append(child)
        elif depth > 1:
            found += _runs_and_checkpoints_inside(child, depth - 1)
    return found


def checkpoint_tokenizer(path: str | Path) -> Path | None:
    """The tokenizer directory saved with the training checkpoint `path`: the checkpoint itself (its
    tokenizer.json, written beside the weights), else, for a checkpoint inside its run
    (runs/X/checkpoints/step_N, a distributed checkpoint), the run's tokenizer/ folder; None when
    neither holds a tokenizer.json."""
    path = Path(path)
    candidates = [path]
    if path.parent.name == "checkpoints":
        candidates.append(path.parent.parent / "tokenizer")
    return next((c for c in candidates if (c / TOKENIZER_FILE).is_file()), None)


def checkpoint_data_config(checkpoint: Checkpoint, run: RunConfig) -> DataConfig:
    """The run's data settings with the tokenizer it trained with: the one saved with the checkpoint
    (`checkpoint_tokenizer`), never a BPE trained again on a corpus that may have changed since (its
    ids would mean other strings). The token cache keys on the tokenizer's fingerprint, so data
    tokenised by any other tokenizer is not reused: the corpus is tokenised again with this one. A
    checkpoint with no saved tokenizer keeps the run's recorded setting."""
    saved = checkpoint_tokenizer(checkpoint.path)
    return run.data if saved is None else dataclasses.replace(run.data, tokenizer=str(saved))


def load_checkpoint(path: str | Path, device: str = "cpu") -> LoadedCheckpoint:
    """Read and verify checkpoint `path`, prepare its run's data (cached) with the tokenizer saved with
    it (`checkpoint_data_config`) and restore its model on `device`."""
    checkpoint = read_checkpoint(Path(path))
    run = RunConfig.from_dict(checkpoint.run_config)
    data = prepare_data(checkpoint_data_config(checkpoint, run))
    model = build_model(run, data.tokenizer.vocab_size, torch.device(device))
    restore_model(checkpoint, model)
    return LoadedCheckpoint(checkpoint, run, data, model)


def load_pretrained(directory: str | Path, data_source: str, device: str = "cpu", seq_len: int | None = None,
                    batch_size: int = 4) -> LoadedCheckpoint:
    """A Hugging Face-format attnres directory (`attnres convert` output, step 0) on `device`, with the
    held-out split of `data_source` (any `DataConfig.source`) tokenised by the directory's own tokenizer.

    The split is DataConfig's default (val_fraction 0.05 by document hash), so a fine-tuning run on
    the same source with default split settings holds out the same documents. Batches are
    `batch_size` x `seq_len` (default: min(max_seq_len, 256)), fp32. Raises CheckpointError for a
    directory that is not such a model or has no tokenizer.
    """
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory} has no config.json: not a Hugging Face-format model directory "
                              f"(`attnres convert` output)")
    if "data" not in finetune_defaults(directory):
        raise CheckpointError(f"{directory} has no tokenizer (tokenizer.json or tokenizer_config.json); its held-out "
                              f"text cannot be tokenised as the model was trained")
    try:
        fields = pretrained_model_fields(directory)
        seq_len = seq_len or min(fields["max_seq_len"], 256)
        run = RunConfig.from_dict({"init_from": str(directory), "model": fields, "out_dir": str(directory),
                                   "data": {"source": data_source, "tokenizer": str(directory)},
                                   "train": {"seq_len": seq_len, "batch_size": batch_size, "precision": "fp32"}})
    except RunConfigError as error:
        raise CheckpointError(str(error)) from None
    data = prepare_data(run.data)
    model = build_model(run, data.tokenizer.vocab_size, torch.device(device))
    load_initial_weights(model, directory)
    return LoadedCheckpoint(Checkpoint(directory, {"step": 0, "run_config": run.to_dict()}), run, data, model)


def held_out_batches(loaded: LoadedCheckpoint, max_batches: int | None = None,
                     device: str = "cpu") -> list[torch.Tensor]:
    """The run's fixed validation batches on `device`; max_batches=None uses train.eval_batches."""
    run = loaded.run
    return [b.to(device) for b in eval_batches(loaded.data.val_tokens, run.train.seq_len, run.train.batch_size,
                                               max_batches or run.train.eval_batches)]


def evaluate_checkpoint(path: str | Path, max_batches: int | None = None, device: str = "cpu") -> dict:
    """Validation loss and perplexity of checkpoint `path` on the validation split of its own data.

    max_batches=None uses the run's train.eval_batches setting. Returns {"checkpoint", "step",
    "val_loss", "val_ppl", "val_tokens"}.
    """
    check_int(max_batches, "evaluate_checkpoint: max_batches", allow_none=True)
    check_device(device, "evaluate_checkpoint: device")
    loaded = load_checkpoint(path, device)
    batches = held_out_batches(loaded, max_batches, device)
    return {"checkpoint": str(loaded.checkpoint.path), "step": loaded.checkpoint.step,
            **validation_loss(loaded, batches)}


def validation_loss(loaded: LoadedCheckpoint, batches: list[torch.Tensor]) -> dict:
    """{"val_loss", "val_ppl", "val_tokens"} of the loaded model on `batches` (the run's precision)."""
    loss = evaluate(loaded.model, batches, loaded.run.train.precision)
    tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_tokens": tokens}
