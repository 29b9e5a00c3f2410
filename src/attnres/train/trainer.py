"""The trainer: set up a run (resume, data, model, wrapping), then optimizer steps with evaluation,
routing diagnostics and checkpoints at their intervals.

    result = Trainer(run, resume=False, device="cpu").fit()     # or train(run, ...)

Inside an initialised process group (torchrun; see attnres.distributed) every rank runs the same
trainer: train.parallel picks DDP or FSDP2 (each rank trains on its rows of every global batch) or
a pipeline (each rank runs its stages on whole batches; docs/explanation/pipeline.md); rank 0 alone writes
logs and metrics. The parallel wrapper and the Checkpointer answer every question that depends on
the parallel mode, so nothing below branches on it.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from attnres.analysis import load_imbalance
from attnres.checkpoint import Checkpoint, CheckpointError, checkpoint_dirs
from attnres.checkpoint.hf_dir import hf_directory_files, read_generation_config
from attnres.common.atomic import write_atomic
from attnres.common.errors import InputError
from attnres.checkpoint.run_lock import RunLock
from attnres.common.run_options import check_out_dir
from attnres.common.machine import check_device
from attnres.data import PreparedData, TokenBatches, eval_batches, prepare_data
from attnres.distributed.checkpointer import Checkpointer
from attnres.distributed.env import Silent, all_reduce_mean, all_reduce_tensor_sum, current_env, is_main, main_first
from attnres.distributed.pipeline_layout import PipelineConfigError, build_layout
from attnres.distributed.wrap import pipeline_config, wrap_model
from attnres.model import AttnResLM, ModelConfig
from attnres.model.flops import parameter_count
from attnres.model.memory_need import FP32_BYTES, check_fits, training_state_bytes
from attnres.model.sublayer_protocols import FeedForward
from attnres.train.train_config import pipeline_setting_error, resolve_parallel
from attnres.train.diagnostics import routing_diagnostics
from attnres.train.evaluate import checkpoint_data_config, evaluate
from attnres.train.starting_model import build_model, draw_normal_queries, load_initial_weights
from attnres.train.metrics import MetricsLogger, records_to_keep
from attnres.train.optim import build_optimizer
from attnres.train.resume import (applied_changes, apply_settings, check_compatible, check_same_corpus,
                                  corpus_digests, optimizer_settings)
from attnres.train.run_config import RunConfig, RunConfigError
from attnres.train.schedule import build_scheduler


class TrainingError(RuntimeError):
    """Training stopped: a non-finite loss or gradient, or a run directory in an unexpected state."""


# What a run writes beside its checkpoints: a fresh run refuses a folder holding any of them (without force).
RUN_FILES = ("config.yaml", "metrics.jsonl", "tokenizer", "tensorboard")


@dataclass
class TrainResult:
    """What a finished run leaves: its directory, model, data, final validation loss, step times."""

    run_dir: Path
    model: AttnResLM
    data: PreparedData
    final_val_loss: float
    step_times: list[float]


def train(run: RunConfig, resume: bool = False, device: str | torch.device = "cpu", log=print,
          on_step: Callable[[dict], object] | None = None, force: bool = False) -> TrainResult:
    """Train `run` from scratch (an empty run directory) or, with `resume`, from its latest checkpoint.

    Writes into run.out_dir: metrics.jsonl, tensorboard/, tokenizer/, checkpoints/step_N/, config.yaml.
    The directory is locked while the run lives (`RunLock`: a second process on it stops at once).
    A fresh run refuses a directory that holds checkpoints, and one that holds a run's other files
    (`RUN_FILES`) unless `force`; a resume refuses train.steps below the checkpoint's step, and a
    model, data, seq_len, batch_size, grad_accum, seed, query_init or init_from other than the
    checkpoint's; every other setting that differs is applied from the next step, with one line on
    stderr naming the old and new value (`attnres.train.resume`).
    Raises TrainingError on a non-finite loss (nothing is saved for that step; the last good
    checkpoint stays) and CheckpointError for a corrupt or mismatched checkpoint. Resuming reads
    either checkpoint format at any world size and parallel kind. on_step(record) is called on rank 0
    after every optimizer step with its metrics record (`Trainer.optimizer_step`), for progress
    displays of a caller (`attnres compare`'s bar over a whole comparison).
    """
    return Trainer(run, resume=resume, device=device, log=log, on_step=on_step, force=force).fit()


class Trainer:
    """One training run. Construction sets it up; `fit()` trains to run.train.steps."""

    def __init__(self, run: RunConfig, resume: bool = False, device: str | torch.device = "cpu", log=print,
                 on_step: Callable[[dict], object] | None = None, force: bool = False) -> None:
        _check_arguments(run, resume, force)
        self.run, self.cfg, self.device = run, run.train, check_device(device, "device")
        self.env = current_env(self.device)
        self.mode = resolve_parallel(self.cfg, self.env)
        self.main = is_main()
        self.log = log if self.main else _quiet
        self.on_step = on_step if self.main else None
        self.run_dir = Path(run.out_dir)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", self.cfg.keep_checkpoints, self.mode)
        self.step, self.val_loss, self.step_times = 0, math.nan, []
        self.changes: list[str] = []  # on resume: the settings that differ from the checkpoint's, applied
        self._hf_files: dict[str, bytes] | None = None  # config, generation defaults, tokenizer: built on first save
        # One process per run directory: a second one stops here, before it reads or writes anything.
        if self.main:
            check_out_dir(self.run_dir, "out_dir")  # a file, a dangling link, no write access: one line now
            _check_outside_source(self.run_dir, run.data.source)
        self._lock = RunLock(self.run_dir).acquire() if self.main else None
        try:
            self._set_up(self._checkpoint_to_resume() if resume else self._check_fresh(force))
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------------ set up

    def _set_up(self, checkpoint: Checkpoint | None) -> None:
        # Resume's inputs are all read and checked before anything is rewritten.
        kept = (records_to_keep(self.run_dir / "metrics.jsonl", checkpoint.step)
                if checkpoint is not None and self.main else None)
        # Rank 0 fills the token cache; the other ranks then read it. A resume tokenises with the
        # tokenizer it trained with, never one trained again on a corpus edited since.
        data_config = self.run.data if checkpoint is None else checkpoint_data_config(checkpoint, self.run)
        self.data = main_first(lambda: prepare_data(data_config))
        if checkpoint is not None:
            check_same_corpus(checkpoint, self.data.stats)
        self.model = self._starting_model(checkpoint)
        self.parallel = wrap_model(self.model, self.mode, self.env, self.cfg.step_settings(), self.cfg.pipeline)
        if self.main:  # only now, with the data, the weights and the split checked: bad input writes nothing
            if checkpoint is None:  # an earlier run's files (force): none of them may mix with this run's
                tokenizer = Path(self.run.data.tokenizer).resolve()  # kept when it is this run's tokenizer
                for name in RUN_FILES:
                    if (self.run_dir / name).resolve() not in (tokenizer, tokenizer.parent):
                        _remove(self.run_dir / name)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.run_dir / "config.yaml", yaml.safe_dump(self.run.to_dict(), sort_keys=False))
            self.data.tokenizer.save(self.run_dir / "tokenizer")
        self.feed_forwards = [m for m in self.model.modules() if isinstance(m, FeedForward)]
        for feed_forward in self.feed_forwards:  # forget anything counted before training (e.g. a warm-up forward)
            feed_forward.after_step(lambda counted: counted, rate=0.0)
        self.optimizer = build_optimizer(self.model, self.cfg, only=self.parallel.trained_parameter_names())
        self.scheduler = build_scheduler(self.optimizer, self.cfg)
        if self.cfg.warmup_steps > self.cfg.steps and self.main:
            _note(f"note: train.warmup_steps={self.cfg.warmup_steps} is more than train.steps={self.cfg.steps}: the "
                  f"learning rate rises through the whole run, to {self.cfg.steps / self.cfg.warmup_steps:.0%} of "
                  f"train.lr, and never decays; lower warmup_steps for a schedule that does")
        self.loader = TokenBatches(self.data.train_tokens, self.cfg.seq_len, self.cfg.batch_size, self.cfg.seed)
        self.stability = self.cfg.stability_monitor()
        # Validation: each rank its rows of every batch, losses averaged; diagnostics: whole batches.
        self.full_val = [b.to(self.device) for b in eval_batches(self.data.val_tokens, self.cfg.seq_len,
                                                                 self.cfg.batch_size, self.cfg.eval_batches)]
        self.val_batches = [self.parallel.local_rows(b) for b in self.full_val]
        if checkpoint is not None:
            settings = optimizer_settings(self.optimizer)  # the checkpoint's replace them on loading
            self.checkpointer.restore_training(checkpoint, self.model, self.optimizer, self.scheduler)
            # this run's rates, weight decay and betas; its schedule rebuilt from them at the checkpoint's step
            self.scheduler = apply_settings(self.optimizer, settings, self.cfg, self.scheduler.last_epoch)
            self.loader.load_state_dict(checkpoint.state["extra"]["data"])
            self._restore_stability(checkpoint)
            self.step = checkpoint.step
            for line in self.changes if self.main else ():
                _note(line)
            self.log(f"resumed from {checkpoint.path} at step {self.step}")
        self.last_saved = checkpoint.path if checkpoint is not None else None
        self.metrics = (MetricsLogger(self.run_dir, self.cfg.tensorboard,
                                      resume_step=self.step if checkpoint is not None else None, kept=kept)
                        if self.main else Silent())

    def _restore_stability(self, checkpoint: Checkpoint) -> None:
        """Continue the event counters and spike window saved with the checkpoint, so the resumed run
        counts what an uninterrupted one would."""
        saved = checkpoint.state["extra"].get("stability")
        if saved is None:  # written before events were counted: only what follows is counted
            self.log(f"{checkpoint.path} holds no event counters; counting loss spikes, gradient-norm spikes "
                     f"and clipped steps from step {checkpoint.step + 1}")
            return
        self.stability.load_state_dict(saved)

    def _check_fresh(self, force: bool) -> None:
        if checkpoint_dirs(self.checkpointer.root):
            raise TrainingError(f"{self.run_dir} already holds checkpoints; pass --resume to continue that run or "
                                f"choose another out_dir")
        found = sorted(name for name in RUN_FILES if (self.run_dir / name).exists())
        if found and not force:
            raise TrainingError(f"{self.run_dir} already holds a run's files ({', '.join(found)}) but no checkpoint; "
                                f"pass --force to overwrite them, or choose another out_dir")

    def _checkpoint_to_resume(self) -> Checkpoint:
        checkpoint = self.checkpointer.latest()
        if checkpoint is None:
            raise CheckpointError(f"nothing to resume: no checkpoint under {self.checkpointer.root}")
        check_compatible(checkpoint.run_config, self.run)
        if self.cfg.steps < checkpoint.step:
            raise InputError(f"train.steps is {self.cfg.steps}, below the step of the checkpoint to resume "
                             f"({checkpoint.step}, {checkpoint.path}); set train.steps to at least {checkpoint.step}")
        self.changes = applied_changes(checkpoint.run_config, self.run, checkpoint.step)
        return checkpoint

    def _starting_model(self, checkpoint: Checkpoint | None) -> AttnResLM:
        """The whole model, on every rank: the run's seed, then a checkpoint's weights (any format, any
        world size) or, for a new run, init_from's weights and the query initialisation."""
        self._check_run(self.run.model.with_vocab_size(self.data.tokenizer.vocab_size))
        model = build_model(self.run, self.data.tokenizer.vocab_size, self.device)
        if self.data.tokenizer.vocab_size > model.config.vocab_size:
            raise RunConfigError(f"the tokenizer has {self.data.tokenizer.vocab_size} tokens but the model only "
                                 f"{model.config.vocab_size}; use the model's own tokenizer (data.tokenizer)")
        if checkpoint is not None:
            self.checkpointer.restore_model(checkpoint, model)
            return model
        if self.run.init_from is not None:
            load_initial_weights(model, self.run.init_from)
        if self.cfg.query_init == "normal":
            draw_normal_queries(model)
        return model

    def _check_run(self, config: ModelConfig) -> None:
        """The one check of the run's model (its vocabulary resolved) against what only the set-up knows,
        before a weight is allocated: the pipeline split against the model and the world size
        (train.pipeline), then the memory a process needs (attnres.model.memory_need): every process
        builds the whole model, and a single one also keeps its gradients and AdamW's moments (shards
        of them elsewhere: only the weights count). What the run file alone decides (routing, seq_len)
        is checked when it is loaded (RunConfig)."""
        if self.mode == "pipeline":
            try:
                build_layout(config, pipeline_config(self.cfg.step_settings(), self.cfg.pipeline), self.env.world_size)
            except PipelineConfigError as error:
                raise pipeline_setting_error(error) from None
        parameters = parameter_count(config).total
        alone = self.env is None or self.env.world_size == 1
        need = training_state_bytes(parameters) if alone else FP32_BYTES * parameters
        what = (f"the model's {parameters:,} parameters with their gradients and AdamW's two moments (fp32) need"
                if alone else f"the model's {parameters:,} fp32 parameters need")
        check_fits(need, what, self.device, "make the model smaller (model.hidden_size, model.num_layers, "
                                            "model.moe.num_experts, model.moe.expert_size)")

    # ------------------------------------------------------------------ training

    def fit(self) -> TrainResult:
        """Train from the current step to run.train.steps; returns the run's result (the whole model,
        current on every rank, and the last validation loss). It trains with PyTorch's deterministic
        algorithms (`torch.use_deterministic_algorithms(True, warn_only=True)`: a resumed run repeats
        its steps) and restores the process's previous setting when it returns or raises."""
        progress = tqdm(total=self.cfg.steps, initial=self.step, disable=not (self.cfg.progress and self.main),
                        unit="step", dynamic_ncols=True, desc="train")
        with deterministic_algorithms():
            try:
                self.model.train()
                while self.step < self.cfg.steps:
                    record = self.optimizer_step()
                    self._at_intervals(record)
                    progress.update(1)
                    progress.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                    if self.on_step is not None:
                        self.on_step(record)
            finally:
                progress.close()
                self.metrics.close()
                self._release()
            self.parallel.sync_parameters()  # the returned model is whole and current on every rank
            if math.isnan(self.val_loss):  # resumed at the last step: nothing was trained, evaluate anyway
                self.val_loss = self.evaluate()
        return TrainResult(self.run_dir, self.model, self.data, self.val_loss, self.step_times)

    def optimizer_step(self) -> dict:
        """One optimizer step (forward and backward through the wrapper, clipping, AdamW, schedule);
        returns its metrics record, with the cumulative event counters (attnres.train.stability) and, on a
        loss or gradient-norm spike, "event": the spikes' names. Raises TrainingError before the update on a
        non-finite loss or norm."""
        start = time.perf_counter()
        loss = self.parallel.train_step(self.loader.next_batch)
        grad_norm = self.parallel.clip_grad_norm(self.cfg.grad_clip)  # the global norm
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", grad_norm)
            raise TrainingError(f"{what} is {value} at step {self.step + 1}; training stopped before the update. "
                                f"Last good checkpoint: {self.last_saved or 'none was written'}")
        events = self.stability.observe(loss, grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        balance = self._balance_experts()
        self.step += 1
        elapsed = time.perf_counter() - start
        self.step_times.append(elapsed)
        tokens = self.cfg.tokens_per_step
        record = {"step": self.step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "step_time_s": elapsed,
                  "tokens_per_s": tokens / elapsed, "tokens": self.step * tokens, **self.parallel.step_metrics(),
                  **self.stability.counters(), **balance}
        if events:
            record["event"] = events
        return record

    def _balance_experts(self) -> dict:
        """After an update, each feed-forward's `after_step` (every rank takes part, whatever its pipeline
        stage): a mixture of experts sums the step's expert loads over ranks and moves its score bias
        towards balance (attnres.model.moe_balance); the step's imbalance per such layer and its
        largest, for the metrics; {} where nothing is balanced."""
        steps = [ff.after_step(all_reduce_tensor_sum, self.cfg.expert_balance_rate) for ff in self.feed_forwards]
        imbalance = [load_imbalance(loads.tolist()) for loads in steps if loads is not None]
        return {"moe/imbalance": imbalance, "moe/imbalance_max": max(imbalance)} if imbalance else {}

    def _at_intervals(self, record: dict) -> None:
        """Evaluate, diagnose, log and save where this step is due for them; a spike step is always logged,
        so every event's step and values are in metrics.jsonl."""
        cfg, step, last = self.cfg, self.step, self.step == self.cfg.steps
        evaluating = step % cfg.eval_every == 0 or last
        diagnosing = cfg.diagnostics_every is not None and (step % cfg.diagnostics_every == 0 or last)
        saving = step % cfg.checkpoint_every == 0 or last
        if evaluating or diagnosing or saving:
            self.parallel.sync_parameters()  # pipeline: every rank's whole model current (else a no-op)
        if evaluating:
            self.val_loss = self.evaluate()
            record.update(val_loss=self.val_loss, val_ppl=math.exp(min(self.val_loss, 50.0)))
        if diagnosing:
            record.update(self.diagnose())
        if step % cfg.log_every == 0 or step == 1 or evaluating or diagnosing or "event" in record:
            self.metrics.log(record)
        if saving:
            self.save()

    def evaluate(self) -> float:
        """Mean validation loss over every rank's rows of the fixed held-out batches."""
        return all_reduce_mean(evaluate(self.model, self.val_batches, self.cfg.precision))

    def diagnose(self) -> dict:
        """Routing diagnostics (attnres.train.diagnostics) on the first diagnostics_batches held-out batches."""
        with self.parallel.inference_context():
            return routing_diagnostics(self.model, self.full_val[:self.cfg.diagnostics_batches])

    def save(self) -> Path:
        """A checkpoint of the current step (a collective in a process group)."""
        if self._hf_files is None and not self.checkpointer.distributed:  # the same for every save
            source = read_generation_config(self.run.init_from) if self.run.init_from else None
            self._hf_files = hf_directory_files(self.model.config, self.data.tokenizer, source)
        extra = {"data": self.loader.state_dict(), "stability": self.stability.state_dict(),
                 "corpus": corpus_digests(self.data.stats)}
        self.last_saved = self.checkpointer.save(self.step, self.model, self.optimizer, self.scheduler,
                                                 self.run.to_dict(), extra, hf_files=self._hf_files)
        return self.last_saved


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """PyTorch's deterministic algorithms (warn only) for the with-block; the process's previous
    setting afterwards."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _check_arguments(run: object, resume: object, force: object) -> None:
    """InputError for a caller's argument of the wrong type (the command builds them right)."""
    if not isinstance(run, RunConfig):
        raise InputError(f"train takes a RunConfig (RunConfig.from_dict(d), or load_run_config(path)), got "
                         f"{type(run).__name__}")
    for name, value in (("resume", resume), ("force", force)):
        if not isinstance(value, bool):
            raise InputError(f"train: {name} must be True or False, got {value!r:.40}")


def _check_outside_source(run_dir: Path, source: str) -> None:
    """InputError when the run directory lies inside a local data.source: its own files (metrics.jsonl,
    config.yaml) would be read as training text by the next run or resume."""
    folder = Path(source).expanduser()
    if not folder.is_dir():  # a file, or a named corpus (python-docs, a hub dataset)
        return
    folder, inside = folder.resolve(), run_dir.resolve()
    if inside == folder or folder in inside.parents:
        raise InputError(f"out_dir {run_dir} is inside data.source {source}: the run's own files (metrics.jsonl, "
                         f"config.yaml) would be read as training text; choose an out_dir outside it")


def _remove(path: Path) -> None:
    """Delete file or folder `path` if it exists (a symlink itself, not its target)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _quiet(*args, **kwargs) -> None:
    """`log` on ranks other than 0."""


def _note(line: str) -> None:
    """A line for the user on stderr (rank 0): a setting a resume changed, a schedule that does not do what it says."""
    print(line, file=sys.stderr)
