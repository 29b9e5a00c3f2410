"""The training loop: data, model, AdamW, schedule, evaluation, checkpoints, resume."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres.data import PreparedData, TokenBatches, eval_batches, prepare_data
from attnres.model import AttnResLM
from attnres.train.checkpoint import (CheckpointError, checkpoint_dirs, latest_checkpoint, restore_model,
                                      restore_training, save_checkpoint)
from attnres.train.config import TrainConfig
from attnres.train.diagnostics import routing_diagnostics
from attnres.train.metrics import MetricsLogger
from attnres.train.optim import build_optimizer
from attnres.train.init import draw_normal_queries, load_initial_weights
from attnres.train.run_config import RunConfig, RunConfigError
from attnres.train.schedule import build_scheduler


class TrainingError(RuntimeError):
    """Training stopped: a non-finite loss or gradient, or a run directory in an unexpected state."""


@dataclass
class TrainResult:
    """What a finished run leaves: its directory, model, data, final validation loss, step times."""

    run_dir: Path
    model: AttnResLM
    data: PreparedData
    final_val_loss: float
    step_times: list[float]


def autocast_context(device: torch.device, precision: str):
    """bf16 autocast (fp32 master weights stay fp32) or nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def evaluate(model: AttnResLM, batches: list[torch.Tensor], precision: str) -> float:
    """Mean next-token loss over `batches` (each (B, T)), every batch weighted by its tokens."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        with autocast_context(batch.device, precision):
            loss = model(batch, labels=batch).loss
        tokens = batch.shape[0] * (batch.shape[1] - 1)
        total, count = total + float(loss) * tokens, count + tokens
    model.train(was_training)
    return total / max(count, 1)


def build_model(run: RunConfig, vocab_size: int, device: torch.device) -> AttnResLM:
    """The run's model, initialised from the run's seed."""
    torch.manual_seed(run.train.seed)
    model = AttnResLM(run.build_model_config(vocab_size)).to(device)
    model.activation_checkpointing = run.train.activation_checkpointing
    return model


def train(run: RunConfig, resume: bool = False, device: str | torch.device = "cpu", log=print) -> TrainResult:
    """Train `run` from scratch (an empty run directory) or, with `resume`, from its latest checkpoint.

    Writes into run.out_dir: metrics.jsonl, tensorboard/, tokenizer/, checkpoints/step_N/, config.yaml.
    Raises TrainingError on a non-finite loss (nothing is saved for that step; the last good
    checkpoint stays) and CheckpointError for a corrupt or mismatched checkpoint.
    """
    device = torch.device(device)
    cfg = run.train
    run_dir = Path(run.out_dir)
    ckpt_root = run_dir / "checkpoints"
    checkpoint = _checkpoint_to_resume(run, ckpt_root) if resume else None
    if not resume and checkpoint_dirs(ckpt_root):
        raise TrainingError(f"{run_dir} already holds checkpoints; pass --resume to continue that run or "
                            f"choose another out_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_config(run, run_dir)
    torch.use_deterministic_algorithms(True, warn_only=True)

    data = prepare_data(run.data, run_dir=run_dir)
    model = build_model(run, data.tokenizer.vocab_size, device)
    if data.tokenizer.vocab_size > model.config.vocab_size:
        raise RunConfigError(f"the tokenizer has {data.tokenizer.vocab_size} tokens but the model only "
                             f"{model.config.vocab_size}; use the model's own tokenizer (data.tokenizer)")
    if checkpoint is None:
        if run.init_from is not None:
            load_initial_weights(model, run.init_from)
        if cfg.query_init == "normal":
            draw_normal_queries(model)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    loader = TokenBatches(data.train_tokens, cfg.seq_len, cfg.batch_size, cfg.seed)
    val_batches = [b.to(device) for b in eval_batches(data.val_tokens, cfg.seq_len, cfg.batch_size, cfg.eval_batches)]
    step = 0
    if checkpoint is not None:
        restore_model(checkpoint, model)
        restore_training(checkpoint, optimizer, scheduler)
        loader.load_state_dict(checkpoint.state["extra"]["data"])
        step = checkpoint.step
        log(f"resumed from {checkpoint.path} at step {step}")
    metrics = MetricsLogger(run_dir, cfg.tensorboard, resume_step=step if checkpoint is not None else None)
    forward = torch.compile(model) if cfg.compile else model
    step_times: list[float] = []
    last_saved = checkpoint.path if checkpoint is not None else None
    progress = _progress_bar(cfg, step)
    val_loss = math.nan
    try:
        model.train()
        while step < cfg.steps:
            start = time.perf_counter()
            loss_sum = 0.0
            for _ in range(cfg.grad_accum):
                batch = loader.next_batch().to(device)
                with autocast_context(device, cfg.precision):
                    loss = forward(batch, labels=batch).loss / cfg.grad_accum
                loss.backward()
                loss_sum += float(loss.detach())
            grad_norm = _clip(model, cfg)
            if not math.isfinite(loss_sum) or not math.isfinite(grad_norm):
                what = "loss" if not math.isfinite(loss_sum) else "gradient norm"
                value = loss_sum if what == "loss" else grad_norm
                raise TrainingError(f"{what} is {value} at step {step + 1}; training stopped before the update. "
                                    f"Last good checkpoint: {last_saved or 'none was written'}")
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            elapsed = time.perf_counter() - start
            step_times.append(elapsed)
            record = {"step": step, "loss": loss_sum, "lr": lr, "grad_norm": grad_norm, "step_time_s": elapsed,
                      "tokens_per_s": cfg.tokens_per_step / elapsed, "tokens": step * cfg.tokens_per_step}
            if step % cfg.eval_every == 0 or step == cfg.steps:
                val_loss = evaluate(model, val_batches, cfg.precision)
                record.update(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50.0)))
            if cfg.diagnostics_every is not None and (step % cfg.diagnostics_every == 0 or step == cfg.steps):
                record.update(routing_diagnostics(model, val_batches[:cfg.diagnostics_batches]))
            if step % cfg.log_every == 0 or step == 1 or "val_loss" in record or "diag/hidden_rms" in record:
                metrics.log(record)
            progress.update(1)
            progress.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                last_saved = save_checkpoint(ckpt_root, step, model, optimizer, scheduler, run.to_dict(),
                                             {"data": loader.state_dict()}, cfg.keep_checkpoints,
                                             hf_config=model.config.to_hf_dict())
    finally:
        progress.close()
        metrics.close()
    if math.isnan(val_loss):  # resumed at the last step: nothing was trained, evaluate anyway
        val_loss = evaluate(model, val_batches, cfg.precision)
    return TrainResult(run_dir, model, data, val_loss, step_times)


def _checkpoint_to_resume(run: RunConfig, ckpt_root: Path):
    checkpoint = latest_checkpoint(ckpt_root)
    if checkpoint is None:
        raise CheckpointError(f"nothing to resume: no checkpoint under {ckpt_root}")
    check_compatible(checkpoint.run_config, run)
    return checkpoint


def check_compatible(saved: dict, run: RunConfig) -> None:
    """Refuse to resume when the model, data or the settings that fix the batch order differ."""
    current = run.to_dict()
    differences = []
    for section in ("model", "data"):
        for key in sorted(set(saved.get(section, {})) | set(current[section])):
            if saved.get(section, {}).get(key) != current[section].get(key):
                differences.append(f"{section}.{key}: checkpoint {saved.get(section, {}).get(key)!r}, "
                                   f"config {current[section].get(key)!r}")
    for key in ("seq_len", "batch_size", "grad_accum", "seed"):
        if saved.get("train", {}).get(key) != current["train"][key]:
            differences.append(f"train.{key}: checkpoint {saved.get('train', {}).get(key)!r}, "
                               f"config {current['train'][key]!r}")
    if differences:
        raise CheckpointError("the checkpoint does not match this config: " + "; ".join(differences))


def _clip(model: AttnResLM, cfg: TrainConfig) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip is not None else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def _progress_bar(cfg: TrainConfig, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.steps, initial=initial, disable=not cfg.progress, unit="step", dynamic_ncols=True,
                desc="train")


def _write_config(run: RunConfig, run_dir: Path) -> None:
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(run.to_dict(), sort_keys=False))
