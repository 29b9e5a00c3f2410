"""What a resume may change (docs/how-to/train.md#what-a-resume-may-change).

Every setting that differs from the checkpoint's is either refused by name (`is_refused`: the model, the
data, what fixes the batch order, what acts only at step 0) or applied from the next step, with one line
naming the old and the new value (`applied_changes`). The optimizer's learning rates, weight decay and
betas are this run's, and its schedule is rebuilt from their base rates at the checkpoint's step
(`apply_settings`), so the run trains with what its config.yaml and checkpoints record. The corpus must
be the one the checkpoint trained on, token for token (`check_same_corpus`).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from attnres.checkpoint import Checkpoint, CheckpointError, latest_checkpoint
from attnres.data import DataConfig
from attnres.model import ModelConfig
from attnres.model.model_config import AUTO_VOCAB
from attnres.train.run_config import RunConfig, RunConfigError
from attnres.train.schedule import build_scheduler
from attnres.train.train_config import TrainConfig

# Refused on resume: the model and its starting weights, the data, the settings that fix the batch order
# and the tokens per step, and query_init, which acts only when a run starts.
REFUSED_TRAIN = ("seq_len", "batch_size", "grad_accum", "seed", "query_init")
# Not a setting: where the run lives (a run directory may be moved).
IGNORED = ("out_dir",)


def setting_differences(saved: dict, run: RunConfig) -> list[tuple[str, object, object]]:
    """(name, checkpoint's value, this run's value) of every setting that differs, e.g. ("train.lr", 0.003,
    0.05); `saved` is a checkpoint's run config in any version's form (a model section of an earlier
    version is compared as today's, `attnres.residual.legacy`; a data or train field added since takes
    its default, as RunConfig.from_dict reads it). out_dir is not compared."""
    current = run.to_dict()
    saved = {**saved, "model": _as_today(saved.get("model", {})),
             "data": {**DataConfig().to_dict(), **saved.get("data", {})},
             "train": {**dataclasses.asdict(TrainConfig()), **saved.get("train", {})}}
    differences = []
    for key in current:
        if key in IGNORED:
            continue
        if isinstance(current[key], dict):
            old_section = saved.get(key) if isinstance(saved.get(key), dict) else {}
            differences += [(f"{key}.{name}", old_section.get(name), current[key].get(name))
                            for name in sorted(set(old_section) | set(current[key]), key=str)
                            if old_section.get(name) != current[key].get(name)]
        elif saved.get(key) != current[key]:
            differences.append((key, saved.get(key), current[key]))
    return differences


def _as_today(model: dict) -> dict:
    """A checkpoint's model section as today's RunConfig writes it: every field (an earlier version
    wrote those the run file gave); as it was where it cannot be read."""
    try:
        return ModelConfig.from_dict({"vocab_size": AUTO_VOCAB, **model}).to_dict()
    except (ValueError, TypeError):
        return model


def is_refused(name: str) -> bool:
    """Whether a resume refuses a change of setting `name` ("model.hidden_size", "train.lr", ...)."""
    section, _, field = name.partition(".")
    return section in ("model", "data", "init_from") or (section == "train" and field in REFUSED_TRAIN)


def check_compatible(saved: dict, run: RunConfig) -> None:
    """CheckpointError naming every refused setting that differs from the checkpoint's (`is_refused`; how
    routing is computed may differ)."""
    refused = [f"{name}: checkpoint {old!r}, config {new!r}" for name, old, new in setting_differences(saved, run)
               if is_refused(name)]
    if refused:
        raise CheckpointError("the checkpoint does not match this config: " + "; ".join(refused) +
                              "; resume with the checkpoint's values or train into another out_dir")


def applied_changes(saved: dict, run: RunConfig, step: int) -> list[str]:
    """One line per setting that differs from the checkpoint's and that a resume applies."""
    return [f"{name} changed on resume: checkpoint {old!r}, now {new!r}; applied from step {step + 1}"
            for name, old, new in setting_differences(saved, run) if not is_refused(name)]


def check_same_settings(run: RunConfig, force: bool = False, log=print) -> None:
    """For a command that resumes the run in run.out_dir without being asked (`attnres compare`,
    `attnres scaling`): RunConfigError naming every setting of its newest checkpoint that differs from
    `run`'s; with `force`, that interrupted run's folder (the command's own) is deleted instead, with a
    line to `log`, so the run trains again with these settings. Nothing to check without a checkpoint."""
    root = Path(run.out_dir) / "checkpoints"
    checkpoint = latest_checkpoint(root, verify=False)  # the trainer verifies the files it resumes
    if checkpoint is None:
        return
    differences = setting_differences(checkpoint.run_config, run)
    if differences:
        latest_checkpoint(root)  # a corrupt checkpoint is named as such first, as a resume would
        named = "; ".join(f"{name}: {old!r} there, {new!r} now" for name, old, new in differences)
        if force:
            log(f"{run.out_dir}: discarding an interrupted run with other settings ({named}), as --force asks")
            shutil.rmtree(run.out_dir)
            return
        raise RunConfigError(f"{run.out_dir} holds an interrupted run with other settings ({named}); choose "
                             f"another --out, or pass --force to discard that run and train it again with these "
                             f"settings")


def corpus_digests(stats: dict) -> dict[str, str]:
    """The digest of each split's token stream (`PreparedData.stats`), saved with every checkpoint."""
    return {name: stats[f"{name}_digest"] for name in ("train", "val", "test") if f"{name}_digest" in stats}


def check_same_corpus(checkpoint: Checkpoint, stats: dict) -> None:
    """CheckpointError when a split's tokens differ from those the checkpoint trained on: the files under
    data.source changed since, so the saved batch position would index other text. A checkpoint saved
    before digests were recorded is not checked."""
    saved = checkpoint.state.get("extra", {}).get("corpus") or {}
    now = corpus_digests(stats)
    changed = [name for name in saved if saved[name] != now.get(name)]
    if changed:
        raise CheckpointError(f"the corpus changed since {checkpoint.path} was saved: the tokens of the "
                              f"{' and '.join(changed)} split{'s' if len(changed) > 1 else ''} differ (the files "
                              f"under data.source were edited, added or removed); restore them to resume, or "
                              f"start a new run from that checkpoint with init_from")


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's base learning rate (`initial_lr`, set by the scheduler), weight decay and
    betas: this run's, read before a checkpoint's replace them (`apply_settings`)."""
    return [{key: group[key] for key in ("initial_lr", "weight_decay", "betas")} for group in optimizer.param_groups]


def apply_settings(optimizer: torch.optim.Optimizer, settings: list[dict], config: TrainConfig,
                   step: int) -> torch.optim.lr_scheduler.LambdaLR:
    """After a checkpoint's optimizer state was loaded: give every parameter group back this run's
    `settings` (`optimizer_settings`) and return the schedule rebuilt from their base rates at `step`
    (the restored scheduler's), so the next step trains at this config's rate for it, as a run with
    this config from the start would."""
    for group, values in zip(optimizer.param_groups, settings, strict=True):
        group.update(values)
    return build_scheduler(optimizer, config, step=step)
