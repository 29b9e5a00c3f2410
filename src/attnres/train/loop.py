"""The training loop: data, model, AdamW, schedule, evaluation, checkpoints, resume."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres.data import PreparedData, TokenBatches, eval_batches, prepare_data
from attnres.distributed.env import Silent, all_reduce_mean, current_env, is_main, main_first
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

    Inside an initialised process group (torchrun; see attnres.distributed) every rank calls this:
    train.parallel picks DDP or FSDP2 (each rank trains on its rows of every global batch) or a
    pipeline (each rank runs its stages on whole batches; docs/pipeline.md); rank 0 alone writes
    logs and metrics, and checkpoints are distributed (DCP). Resuming reads either checkpoint
    format at any world size and parallel kind.
    """
    from attnres.distributed.data_parallel import local_rows, resolve_parallel, wrap_model

    device = torch.device(device)
    cfg = run.train
    env = current_env(device)
    parallel_mode = resolve_parallel(cfg, env)
    main = is_main()
    log = log if main else _quiet
    run_dir = Path(run.out_dir)
    ckpt_root = run_dir / "checkpoints"
    checkpoint = _checkpoint_to_resume(run, ckpt_root) if resume else None
    if not resume and checkpoint_dirs(ckpt_root):
        raise TrainingError(f"{run_dir} already holds checkpoints; pass --resume to continue that run or "
                            f"choose another out_dir")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_config(run, run_dir)
    torch.use_deterministic_algorithms(True, warn_only=True)

    # Rank 0 fills the token cache and writes the tokenizer; the other ranks then read the cache.
    data = main_first(lambda: prepare_data(run.data, run_dir=run_dir if main else None))
    model = build_model(run, data.tokenizer.vocab_size, device)
    if data.tokenizer.vocab_size > model.config.vocab_size:
        raise RunConfigError(f"the tokenizer has {data.tokenizer.vocab_size} tokens but the model only "
                             f"{model.config.vocab_size}; use the model's own tokenizer (data.tokenizer)")
    if checkpoint is None:
        if run.init_from is not None:
            load_initial_weights(model, run.init_from)
        if cfg.query_init == "normal":
            draw_normal_queries(model)
    else:
        restore_model(checkpoint, model)  # whole weights, before sharding: any format, any world size
    parallel = wrap_model(model, cfg, parallel_mode, env)
    optimizer = build_optimizer(model, cfg, only=parallel.trained_parameter_names())
    scheduler = build_scheduler(optimizer, cfg)
    loader = TokenBatches(data.train_tokens, cfg.seq_len, cfg.batch_size, cfg.seed)
    rows_env = None if parallel_mode == "pipeline" else env  # pipeline ranks all take whole batches
    # Validation: each rank its rows of every batch, losses averaged; diagnostics: whole batches.
    full_val = [b.to(device) for b in eval_batches(data.val_tokens, cfg.seq_len, cfg.batch_size, cfg.eval_batches)]
    val_batches = [local_rows(b, rows_env) for b in full_val]
    step = 0
    if checkpoint is not None:
        if parallel_mode == "none" and not checkpoint.is_dcp:
            restore_training(checkpoint, optimizer, scheduler)
        else:
            from attnres.distributed.checkpoint import restore_training_state

            restore_training_state(checkpoint, model, optimizer, scheduler)
        loader.load_state_dict(checkpoint.state["extra"]["data"])
        step = checkpoint.step
        log(f"resumed from {checkpoint.path} at step {step}")
    metrics = (MetricsLogger(run_dir, cfg.tensorboard, resume_step=step if checkpoint is not None else None)
               if main else Silent())
    forward = torch.compile(parallel.forward) if cfg.compile else parallel.forward

    def next_batch() -> torch.Tensor:
        return local_rows(loader.next_batch(), rows_env).to(device)

    step_times: list[float] = []
    last_saved = checkpoint.path if checkpoint is not None else None
    progress = _progress_bar(cfg, step, enabled=main)
    val_loss = math.nan
    try:
        model.train()
        while step < cfg.steps:
            start = time.perf_counter()
            if parallel.train_step is not None:  # the pipeline: its schedule runs forward and backward
                loss_sum = parallel.train_step(next_batch)
            else:
                loss_sum = accumulate_gradients(parallel, forward, next_batch, cfg, device)
            grad_norm = parallel.clip_grad_norm(cfg.grad_clip)  # the global norm
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
                      "tokens_per_s": cfg.tokens_per_step / elapsed, "tokens": step * cfg.tokens_per_step,
                      **parallel.step_metrics()}
            evaluating = step % cfg.eval_every == 0 or step == cfg.steps
            diagnosing = cfg.diagnostics_every is not None and (step % cfg.diagnostics_every == 0 or step == cfg.steps)
            saving = step % cfg.checkpoint_every == 0 or step == cfg.steps
            if evaluating or diagnosing or saving:
                parallel.sync_parameters()  # pipeline: every rank's whole model current (else a no-op)
            if evaluating:
                val_loss = all_reduce_mean(evaluate(model, val_batches, cfg.precision))
                record.update(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50.0)))
            if diagnosing:
                # FSDP's bf16 sub-layer weights need autocast to meet the fp32 stream.
                with autocast_context(device, cfg.precision) if parallel_mode == "fsdp" else nullcontext():
                    record.update(routing_diagnostics(model, full_val[:cfg.diagnostics_batches]))
            if step % cfg.log_every == 0 or step == 1 or "val_loss" in record or "diag/hidden_rms" in record:
                metrics.log(record)
            progress.update(1)
            progress.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if saving:
                last_saved = _save(ckpt_root, step, model, optimizer, scheduler, run, loader, parallel_mode)
    finally:
        progress.close()
        metrics.close()
    parallel.sync_parameters()  # the returned model is whole and current on every rank
    if math.isnan(val_loss):  # resumed at the last step: nothing was trained, evaluate anyway
        val_loss = all_reduce_mean(evaluate(model, val_batches, cfg.precision))
    return TrainResult(run_dir, model, data, val_loss, step_times)


def accumulate_gradients(parallel, forward, next_batch, cfg: TrainConfig, device: torch.device) -> float:
    """One optimizer step's forward and backward over cfg.grad_accum micro-batches, each next_batch()
    (this rank's rows (B / W, T) on `device`), through `forward` (the model or its DDP wrapper).

    Gradients are left synchronised in .grad (DDP's all-reduce on the last micro-batch, FSDP's
    reduce-scatter, `parallel.finish_gradients`). Returns the global batch's mean loss, the same on
    every rank."""
    loss_sum = 0.0
    for micro in range(cfg.grad_accum):
        batch = next_batch()
        with parallel.gradient_sync(micro == cfg.grad_accum - 1):
            with autocast_context(device, cfg.precision):
                loss = forward(batch, labels=batch).loss / cfg.grad_accum
            loss.backward()
        loss_sum += float(loss.detach())
    parallel.finish_gradients()
    return all_reduce_mean(loss_sum)


def _save(root: Path, step: int, model: AttnResLM, optimizer, scheduler, run: RunConfig, loader: TokenBatches,
          parallel_mode: str) -> Path:
    """A single-process checkpoint (safetensors), or with DDP/FSDP/pipeline a distributed one from every rank."""
    extra = {"data": loader.state_dict()}
    if parallel_mode == "none":
        return save_checkpoint(root, step, model, optimizer, scheduler, run.to_dict(), extra,
                               run.train.keep_checkpoints, hf_config=model.config.to_hf_dict())
    from attnres.distributed.checkpoint import save_dcp_checkpoint

    return save_dcp_checkpoint(root, step, model, optimizer, scheduler, run.to_dict(), extra,
                               run.train.keep_checkpoints, parallel_mode)


def _checkpoint_to_resume(run: RunConfig, ckpt_root: Path):
    if current_env() is None:
        checkpoint = latest_checkpoint(ckpt_root)
    else:  # every rank needs it; the hashing is shared out
        from attnres.distributed.checkpoint import latest_checkpoint_shared

        checkpoint = latest_checkpoint_shared(ckpt_root)
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


def _progress_bar(cfg: TrainConfig, initial: int, enabled: bool = True):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.steps, initial=initial, disable=not (cfg.progress and enabled), unit="step",
                dynamic_ncols=True, desc="train")


def _quiet(*args, **kwargs) -> None:
    """`log` on ranks other than 0."""


def _write_config(run: RunConfig, run_dir: Path) -> None:
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(run.to_dict(), sort_keys=False))
