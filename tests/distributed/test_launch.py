"""The real command line under torchrun: `python -m torch.distributed.run --nproc_per_node=2 -m attnres train`."""

import os
import subprocess
import sys

from attnres.cli import main
from attnres.train import read_checkpoint
from attnres.checkpoint import checkpoint_dirs
from attnres.train.metrics import read_metrics
from tests.train.conftest import corpus_dir, write_config  # noqa: F401  (fixtures)


def test_torchrun_trains_with_rank0_outputs_and_a_checkpoint_that_resumes(write_config, tmp_path):  # noqa: F811
    path, run = write_config("launched", steps=4, checkpoint_every=2, eval_every=2)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "attnres", "train", "--config", str(path), "--set", "train.parallel=fsdp"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("done: 4 steps") == 1  # rank 0 alone reports
    run_dir = tmp_path / "launched"
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]  # one metrics.jsonl, written once
    checkpoints = checkpoint_dirs(run_dir / "checkpoints")
    assert [p.name for p in checkpoints] == ["step_00000002", "step_00000004"]
    state = read_checkpoint(checkpoints[-1]).state
    assert state["world_size"] == 2 and state["parallel"] == "fsdp"
    # resume without torchrun: one process continues the 2-rank run
    assert main(["train", "--config", str(path), "--resume", "--set", "train.steps=6"]) == 0
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert read_checkpoint(checkpoint_dirs(run_dir / "checkpoints")[-1]).step == 6


def test_torchrun_refuses_a_batch_that_does_not_split(write_config):  # noqa: F811
    path, _ = write_config("uneven", steps=2, batch_size=3)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "attnres", "train", "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    assert "train.batch_size=3 (the global batch) must be divisible by the world size 2" in result.stderr


def test_torchrun_trains_a_pipeline_from_the_command_line(write_config, tmp_path):  # noqa: F811
    path, _ = write_config("piped", steps=2, checkpoint_every=2, eval_every=2)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "attnres", "train", "--config", str(path), "--set", "train.parallel=pipeline",
               "--set", "train.pipeline.schedule=gpipe", "--set", "train.pipeline.num_microbatches=2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("done: 2 steps") == 1
    records = read_metrics(tmp_path / "piped")
    assert [r["step"] for r in records] == [1, 2] and "val_loss" in records[-1]
    assert all(r["pipe/fwd_bytes"] > 0 and r["pipe/bwd_bytes"] > 0 and "pipe/saved_bytes" in r for r in records)
    checkpoints = checkpoint_dirs(tmp_path / "piped" / "checkpoints")
    assert [p.name for p in checkpoints] == ["step_00000002"]
    state = read_checkpoint(checkpoints[0]).state
    assert state["parallel"] == "pipeline" and state["run_config"]["train"]["pipeline"]["schedule"] == "gpipe"
