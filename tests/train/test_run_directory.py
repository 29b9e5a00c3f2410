"""A run directory is owned by one run: locked while it lives, never overwritten without asking,
resumed only to a step at or past its checkpoint, and a torn log does not strand a resume."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from attnres.cli import main
from attnres.checkpoint.run_lock import LOCK_FILE, RunDirectoryBusy, RunLock
from attnres.train import load_run_config, train
from attnres.train.metrics import read_records, records_to_keep


def out_dir(run):
    from pathlib import Path

    return Path(run["out_dir"])


# ---------------------------------------------------------------- the lock


def test_a_second_holder_stops_at_once_naming_the_folder_and_the_pid(tmp_path):
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunDirectoryBusy, match=rf"out_dir {tmp_path / 'run'} is in use by another attnres "
                                                   rf"process \(pid {os.getpid()}\)"):
            RunLock(tmp_path / "run").acquire()
    with RunLock(tmp_path / "run"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    code = (f"import os, signal; from attnres.checkpoint.run_lock import RunLock; "
            f"RunLock({str(tmp_path / 'run')!r}).acquire(); print('held', flush=True); "
            f"os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL and child.stdout == "held\n", child.stderr
    assert (tmp_path / "run" / LOCK_FILE).is_file()
    with RunLock(tmp_path / "run"):  # the kernel released it with the process
        pass


def test_letting_go_removes_the_lock_file_and_a_folder_it_created_that_stayed_empty(tmp_path):
    RunLock(tmp_path / "new" / "run").acquire().release()
    assert not (tmp_path / "new").exists()
    lock = RunLock(tmp_path / "used").acquire()
    (tmp_path / "used" / "config.yaml").write_text("{}")
    lock.release()
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["config.yaml"]  # the lock file goes too


def test_train_on_a_folder_another_process_holds_is_one_line_and_writes_nothing(write_config, capsys):
    path, run = write_config(steps=4)
    with RunLock(out_dir(run)):
        assert main(["train", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"out_dir {out_dir(run)} is in use by another attnres process (pid {os.getpid()})" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert sorted(p.name for p in out_dir(run).iterdir()) == [LOCK_FILE]
    assert main(["train", "--config", str(path)]) == 0


def test_an_out_dir_inside_a_file_is_one_line_naming_it(write_config, tmp_path, capsys):
    path, run = write_config()
    (tmp_path / "plain").write_text("x")
    assert main(["train", "--config", str(path), "--set", f"out_dir={tmp_path / 'plain' / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert f"out_dir {tmp_path / 'plain' / 'run'} cannot be created: {tmp_path / 'plain'} is a file" in err
    assert len(err.strip().splitlines()) == 1


def test_a_failed_set_up_leaves_no_folder_behind(write_config, tmp_path, capsys):
    path, run = write_config()
    assert main(["train", "--config", str(path), "--set", f"data.source={tmp_path / 'nothing'}"]) == 2
    assert not out_dir(run).exists()


# ---------------------------------------------------------------- overwriting and resuming


def test_a_folder_with_run_files_and_no_checkpoint_is_not_overwritten_without_force(write_config, capsys):
    path, run = write_config(steps=4)
    out_dir(run).mkdir()
    (out_dir(run) / "config.yaml").write_text("kept: true\n")
    (out_dir(run) / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    assert main(["train", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "already holds a run's files (config.yaml, metrics.jsonl) but no checkpoint; pass --force" in err
    assert (out_dir(run) / "config.yaml").read_text() == "kept: true\n"
    assert main(["train", "--config", str(path), "--force"]) == 0
    assert yaml.safe_load((out_dir(run) / "config.yaml").read_text())["train"]["steps"] == 4


def test_force_clears_the_earlier_runs_tensorboard_events_and_tokenizer_files(write_config):
    path, run = write_config(steps=2, tensorboard=True)
    for name in ("tensorboard", "tokenizer"):
        (out_dir(run) / name).mkdir(parents=True)
        (out_dir(run) / name / "earlier-run").write_text("of a run trained before")
    assert main(["train", "--config", str(path), "--force"]) == 0
    events = list((out_dir(run) / "tensorboard").iterdir())
    assert events and all(p.name.startswith("events.out.tfevents") for p in events)  # no curves of two runs
    assert not (out_dir(run) / "tokenizer" / "earlier-run").exists()


def test_resume_refuses_steps_below_the_checkpoint_and_rewrites_nothing(write_config, capsys):
    path, run = write_config(steps=8)
    train(load_run_config(path))
    config_before = (out_dir(run) / "config.yaml").read_bytes()
    metrics_before = (out_dir(run) / "metrics.jsonl").read_bytes()
    assert main(["train", "--config", str(path), "--resume", "--set", "train.steps=4"]) == 2
    err = capsys.readouterr().err
    assert "train.steps is 4, below the step of the checkpoint to resume (8," in err
    assert "set train.steps to at least 8" in err
    assert (out_dir(run) / "config.yaml").read_bytes() == config_before
    assert (out_dir(run) / "metrics.jsonl").read_bytes() == metrics_before


def test_a_hand_broken_metrics_line_stops_resume_before_anything_is_rewritten(write_config, capsys):
    path, run = write_config(steps=8)
    train(load_run_config(path))
    metrics = out_dir(run) / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[2] = "[1, 2]"
    metrics.write_text("\n".join(lines) + "\n")
    config_before = (out_dir(run) / "config.yaml").read_bytes()
    assert main(["train", "--config", str(path), "--resume", "--set", "train.steps=12"]) == 2
    err = capsys.readouterr().err
    assert f"{metrics} line 3 is a JSON list, not an object" in err and "fix or remove line 3" in err
    assert (out_dir(run) / "config.yaml").read_bytes() == config_before


# ---------------------------------------------------------------- the log reader, fuzzed at every byte


RECORDS = [{"step": 1, "loss": 3.25}, {"step": 2, "loss": 3.0, "event": ["loss_spike"]},
           {"step": 3, "loss": 2.875, "val_loss": 2.9}]


def test_truncation_at_every_byte_of_the_last_line_keeps_every_whole_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    whole = "".join(json.dumps(r) + "\n" for r in RECORDS)
    last_start = whole.rindex("\n", 0, len(whole) - 1) + 1
    for cut in range(last_start, len(whole) + 1):
        path.write_text(whole[:cut])
        warned = []
        records = read_records(path, warn=warned.append)
        complete = cut >= len(whole) - 1  # the last record whole, with or without its newline
        assert records == (RECORDS if complete else RECORDS[:2]), cut
        assert len(warned) == (0 if complete or cut == last_start else 1), cut
        if warned:
            assert warned[0].startswith(f"{path} line 3 is ") and warned[0].endswith("dropped")


def test_records_to_keep_stops_at_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"step": 4, "lo')
    with pytest.warns(UserWarning, match="line 4 is not JSON"):
        assert records_to_keep(path, 2) == RECORDS[:2]


def test_a_data_cache_that_is_a_file_is_one_line_and_leaves_no_run_folder(write_config, tmp_path, monkeypatch, capsys):
    path, run = write_config()
    (tmp_path / "cache-file").write_text("x")
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache-file"))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"$ATTNRES_CACHE {tmp_path / 'cache-file'} is a file, not a folder" in err
    assert len(err.strip().splitlines()) == 1 and not out_dir(run).exists()


def test_an_incomplete_newest_checkpoint_is_refused_with_the_remedy(write_config, capsys):
    path, run = write_config(steps=8)
    train(load_run_config(path))
    (out_dir(run) / "checkpoints" / "step_00000008" / "state.json").unlink()
    assert main(["train", "--config", str(path), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "is incomplete: state.json is missing; move step_00000008 out of" in err
    assert "to resume from step_00000004" in err


def test_an_extensions_folder_that_is_a_file_is_one_line_and_leaves_no_run_folder(write_config, tmp_path, monkeypatch,
                                                                                  capsys):
    from attnres.routing import fused_cpu

    path, run = write_config(routing_impl="fused")  # the kernel must be built, into a folder that is a file
    (tmp_path / "extensions-file").write_text("x")
    monkeypatch.setenv("ATTNRES_EXTENSIONS_DIR", str(tmp_path / "extensions-file"))
    monkeypatch.setitem(fused_cpu._state, "loaded", False)  # as in a process that has not loaded it
    monkeypatch.setattr(fused_cpu, "find_compiler", lambda: "/usr/bin/g++")  # a compiler is there to build it
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"$ATTNRES_EXTENSIONS_DIR {tmp_path / 'extensions-file'} is a file, not a folder" in err
    assert len(err.strip().splitlines()) == 1 and not out_dir(run).exists()


def test_a_disk_filling_mid_run_is_one_line_naming_the_file_and_leaves_no_partial_checkpoint(write_config, monkeypatch,
                                                                                                capsys):
    from safetensors import SafetensorError

    from attnres.checkpoint import single

    def full_disk(tensors, path):  # safetensors' own words for ENOSPC, as a full file system gives them
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    path, run = write_config(steps=4)
    monkeypatch.setattr(single, "save_file", full_disk)
    assert main(["train", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "trainer.safetensors: No space left on device; free space" in err and "--resume continues" in err
    assert list((out_dir(run) / "checkpoints").iterdir()) == []  # no step folder, no temporary one


def test_shards_share_a_folder_and_each_shard_is_one_process(tmp_path):
    out = tmp_path / "sweep"
    first, second = RunLock(out, "--out", (0, 2)).acquire(), RunLock(out, "--out", (1, 2)).acquire()  # side by side
    with pytest.raises(RunDirectoryBusy, match=rf"--out {out} is in use for shard 0/2 by another attnres process "
                                               rf"\(pid {os.getpid()}\)"):
        RunLock(out, "--out", (0, 2)).acquire()
    with pytest.raises(RunDirectoryBusy, match=rf"--out {out} is in use by the shards of a sharded attnres run"):
        RunLock(out, "--out").acquire()  # an unsharded run would train the shards' runs too
    first.release()
    with pytest.raises(RunDirectoryBusy):
        RunLock(out, "--out").acquire()  # one shard still runs
    second.release()
    assert list(out.iterdir()) == []  # the last one out removed the shared lock file
    with RunLock(out, "--out"):
        with pytest.raises(RunDirectoryBusy, match=rf"is in use by another attnres process \(pid {os.getpid()}\)"):
            RunLock(out, "--out", (1, 2)).acquire()


@pytest.mark.parametrize("command", [["compare", "--preset", "smoke"], ["scaling", "--preset", "tiny"]])
def test_compare_and_scaling_on_a_folder_in_use_stop_at_once_in_one_line(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    with RunLock(out, "--out"):
        assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out} is in use by another attnres process (pid {os.getpid()})" in err


def test_a_warm_up_longer_than_the_run_is_said_on_stderr(write_config, capsys):
    path, run = write_config(steps=2, warmup_steps=8)
    assert main(["train", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert ("note: train.warmup_steps=8 is more than train.steps=2: the learning rate rises through the whole run, "
            "to 25% of train.lr, and never decays") in err
    path, run = write_config("ok", steps=2, warmup_steps=2)
    assert main(["train", "--config", str(path)]) == 0
    assert "warmup_steps" not in capsys.readouterr().err


@pytest.mark.parametrize("call, message", [
    (lambda run: train(run.to_dict()), r"train takes a RunConfig \(RunConfig.from_dict\(d\), or "
                                       r"load_run_config\(path\)\), got dict"),
    (lambda run: train(run, resume="no"), r"train: resume must be True or False, got 'no'"),
    (lambda run: train(run, force=1), r"train: force must be True or False, got 1"),
    (lambda run: train(run, device="gpu"), r"device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
])
def test_the_python_train_refuses_arguments_of_the_wrong_type_before_anything_is_written(write_config, call,
                                                                                         message):
    from attnres.common.errors import InputError

    path, run = write_config()
    with pytest.raises(InputError, match=message):
        call(load_run_config(path))
    assert not out_dir(run).exists()
