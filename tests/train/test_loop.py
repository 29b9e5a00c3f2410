"""Training end to end: runs, resumes exactly after a kill, survives a kill mid-save, stops on NaN."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from attnres.cli import main
from attnres.train import CheckpointError, TrainingError, latest_checkpoint, load_run_config, train
from attnres.checkpoint import checkpoint_dirs, read_checkpoint
from attnres.train.metrics import read_metrics

# Runs `attnres train` in a child process that SIGKILLs itself at a chosen point: a real crash,
# with nothing flushed or cleaned up, at a reproducible place.
KILLER = textwrap.dedent("""
    import os, signal, sys
    import attnres.train.metrics as metrics
    import attnres.checkpoint.single as ckpt
    mode, at = sys.argv[1], int(sys.argv[2])
    if mode == "after_step":
        original = metrics.MetricsLogger.log
        def log(self, record):
            original(self, record)
            if record["step"] == at:
                os.kill(os.getpid(), signal.SIGKILL)
        metrics.MetricsLogger.log = log
    elif mode == "during_log":  # die half-way through writing step `at`'s line: a torn last line
        original = metrics.MetricsLogger.log
        def log(self, record):
            if record["step"] != at:
                return original(self, record)
            line = metrics.json.dumps(record) + "\\n"
            with open(self.path, "a") as handle:
                handle.write(line[:len(line) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        metrics.MetricsLogger.log = log
    else:  # "during_save": die after the model file of checkpoint `at` is written, before the rest
        original = ckpt.save_file
        def save_file(tensors, path, *a, **k):
            if f"step_{at:08d}" in path:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(tensors, path, *a, **k)
        ckpt.save_file = save_file
    from attnres.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def run_cli(args, killer=None, env=None):
    code = ["-c", KILLER, *killer] if killer else ["-m", "attnres"]
    return subprocess.run([sys.executable, *code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir)]


def test_train_writes_metrics_checkpoints_and_lowers_the_loss(write_config, capsys):
    path, run = write_config()
    result = train(load_run_config(path))
    records = read_metrics(result.run_dir)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert records[-1]["loss"] < records[0]["loss"]
    assert {"lr", "grad_norm", "tokens_per_s", "step_time_s"} <= set(records[0])
    assert [r["step"] for r in records if "val_loss" in r] == [4, 8, 12]
    assert [p.name for p in checkpoint_dirs(result.run_dir / "checkpoints")] == \
        ["step_00000004", "step_00000008", "step_00000012"]
    assert (result.run_dir / "tokenizer").is_dir() and (result.run_dir / "config.yaml").is_file()
    # evaluating the final checkpoint reproduces the loop's final validation loss
    capsys.readouterr()
    assert main(["eval", str(result.run_dir)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 12 and report["val_loss"] == pytest.approx(result.final_val_loss, rel=1e-6)
    assert report["val_loss"] == pytest.approx(records[-1]["val_loss"], rel=1e-6)


@pytest.mark.parametrize("killer", ["after_step", "during_log"])
def test_resume_after_a_killed_process_continues_exactly(write_config, killer):
    """Killed after step 6's line, or half-way through writing it (a torn last line, dropped on
    resume with one warning): the resumed run's losses equal an uninterrupted run's."""
    path, run = write_config("full")
    env = {"ATTNRES_CACHE": os.environ["ATTNRES_CACHE"]}
    assert run_cli(["train", "--config", str(path)], env=env).returncode == 0
    killed_cfg, killed = write_config("killed")
    result = run_cli(["train", "--config", str(killed_cfg)], killer=[killer, "6"], env=env)
    assert result.returncode == -9, result.stderr
    assert read_checkpoint(checkpoint_dirs(tmp_dir(killed) / "checkpoints")[-1]).step == 4
    torn = not (tmp_dir(killed) / "metrics.jsonl").read_text().endswith("\n")
    assert torn == (killer == "during_log")
    result = run_cli(["train", "--config", str(killed_cfg), "--resume"], env=env)
    assert result.returncode == 0, result.stderr
    assert ("metrics.jsonl line 6 is not JSON" in result.stderr and "dropped" in result.stderr) == torn
    assert losses(tmp_dir(killed)) == losses(tmp_dir(run))  # bitwise equal, steps 1..12


def test_kill_during_save_leaves_the_last_checkpoint_loadable(write_config):
    path, run = write_config("crash")
    env = {"ATTNRES_CACHE": os.environ["ATTNRES_CACHE"]}
    result = run_cli(["train", "--config", str(path)], killer=["during_save", "8"], env=env)
    assert result.returncode == -9, result.stderr
    root = tmp_dir(run) / "checkpoints"
    assert [p.name for p in checkpoint_dirs(root)] == ["step_00000004"]
    assert latest_checkpoint(root).step == 4  # verified: sizes and hashes match
    assert any(p.name.startswith(".tmp-") for p in root.iterdir())  # the half-written one, ignored
    assert run_cli(["train", "--config", str(path), "--resume"], env=env).returncode == 0
    assert [p.name for p in checkpoint_dirs(root)] == ["step_00000004", "step_00000008", "step_00000012"]
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())


def tmp_dir(run):
    from pathlib import Path

    return Path(run["out_dir"])


def test_corrupt_checkpoint_is_refused_and_left_untouched(write_config, capsys):
    path, run = write_config(steps=4)
    train(load_run_config(path))
    ckpt = checkpoint_dirs(tmp_dir(run) / "checkpoints")[-1]
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is corrupt: model.safetensors does not match its recorded size"):
        read_checkpoint(ckpt)
    assert main(["train", "--config", str(path), "--resume", "--set", "train.steps=8"]) == 1
    assert "is corrupt" in capsys.readouterr().err
    assert weights.read_bytes() == bytes(data)  # nothing rewrote it
    (ckpt / "state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="state.json does not parse"):
        read_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(ckpt.parent / "step_99999999")


def test_mismatched_config_is_refused(write_config, capsys):
    path, run = write_config(steps=4)
    train(load_run_config(path))
    code = main(["train", "--config", str(path), "--resume", "--set", "model.hidden_size=64",
                 "--set", "train.steps=8"])
    assert code == 1
    err = capsys.readouterr().err
    assert "does not match this config: " in err and "model.hidden_size: checkpoint 32, config 64" in err
    with pytest.raises(TrainingError, match="already holds checkpoints; pass --resume"):
        train(load_run_config(path))
    with pytest.raises(CheckpointError, match="nothing to resume"):
        train(load_run_config(path, ["out_dir=" + str(tmp_dir(run).parent / "fresh")]), resume=True)


def test_non_finite_loss_stops_with_message_and_keeps_last_checkpoint(write_config, monkeypatch):
    path, run = write_config()
    import attnres.model.decoder as decoder

    original = decoder.next_token_loss
    calls = {"n": 0}

    def poisoned(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        return loss * float("nan") if calls["n"] == 7 else loss  # steps 1-4, 2 eval batches, then step 5

    monkeypatch.setattr(decoder, "next_token_loss", poisoned)
    with pytest.raises(TrainingError, match=r"loss is nan at step 5; training stopped before the update. "
                                            r"Last good checkpoint: .*step_00000004"):
        train(load_run_config(path))
    assert latest_checkpoint(tmp_dir(run) / "checkpoints").step == 4


@pytest.mark.parametrize("override, pattern, code", [
    ("data.source=/no/such/dir", r"/no/such/dir", 2),
    ("train.seq_len=128", r"train.seq_len=128 is above the model's maximum model.max_seq_len=64", 2),
])
def test_cli_input_errors(write_config, capsys, override, pattern, code):
    path, _ = write_config()
    assert main(["train", "--config", str(path), "--set", override]) == code
    assert pytest.importorskip("re").search(pattern, capsys.readouterr().err)


def test_empty_corpus_is_a_clear_error(write_config, tmp_path, capsys):
    path, _ = write_config()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("   \n")
    assert main(["train", "--config", str(path), "--set", f"data.source={empty}"]) == 2
    assert "empty" in capsys.readouterr().err.lower()


def test_metrics_jsonl_is_valid_json_lines(write_config):
    path, run = write_config(steps=4)
    train(load_run_config(path))
    lines = (tmp_dir(run) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(isinstance(json.loads(line), dict) for line in lines)


def test_gradient_accumulation_matches_the_larger_batch(write_config):
    """Two micro-batches of 2 see the same 4 sequences as one batch of 4: same losses and updates."""
    path_a, _ = write_config("accum", steps=3, batch_size=2, grad_accum=2, checkpoint_every=3)
    path_b, _ = write_config("whole", steps=3, batch_size=4, grad_accum=1, checkpoint_every=3)
    a = read_metrics(train(load_run_config(path_a)).run_dir)
    b = read_metrics(train(load_run_config(path_b)).run_dir)
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-5)
    assert [r["grad_norm"] for r in a] == pytest.approx([r["grad_norm"] for r in b], rel=1e-4)


def test_tensorboard_events_are_written(write_config):
    path, run = write_config(steps=2, tensorboard=True, checkpoint_every=2)
    train(load_run_config(path))
    events = list((tmp_dir(run) / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_deterministic_algorithms_hold_while_training_only(write_config):
    """A library user's process keeps its own setting: training turns PyTorch's deterministic
    algorithms on (a resumed run repeats its steps) and restores the setting after, also on error."""
    import dataclasses

    import torch

    from attnres.train.trainer import Trainer

    path, _ = write_config(steps=2)
    trainer = Trainer(load_run_config(path))
    assert not torch.are_deterministic_algorithms_enabled()  # setting up does not change it
    seen = []
    original = trainer.optimizer_step
    trainer.optimizer_step = lambda: seen.append(torch.are_deterministic_algorithms_enabled()) or original()
    trainer.fit()
    assert seen == [True, True] and not torch.are_deterministic_algorithms_enabled()
    trainer.optimizer_step = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    trainer.cfg = dataclasses.replace(trainer.cfg, steps=3)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert not torch.are_deterministic_algorithms_enabled()
