"""Process-group helpers: no-ops in one process, collectives on 2 ranks, joining torchrun's group."""

import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attnres.cli import main
from attnres.distributed import env
from tests.distributed.dp_runs import shared_runs
from tests.distributed.spawn import free_port
from tests.train.conftest import corpus_dir, write_config  # noqa: F401  (fixtures)


def test_helpers_are_no_ops_in_one_process(monkeypatch):
    for name in env.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not env.launched_by_torchrun() and env.init_from_env("cpu") is None
    assert env.current_env() is None and env.is_main()
    env.barrier()
    assert env.all_reduce_mean(2.5) == 2.5 and env.all_gather_objects("x") == ["x"]
    assert env.main_first(lambda: 7) == 7
    silent = env.Silent()
    assert silent.log({"step": 1}) is None and silent.close() is None


def test_init_from_env_joins_the_group_torchrun_describes(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        joined = env.init_from_env("cpu")
        assert joined == env.DistributedEnv(0, 1, 0, torch.device("cpu")) and joined.is_main
        assert dist.get_backend() == "gloo" and env.all_reduce_mean(3.0) == 3.0
    finally:
        env.shutdown()
    assert not dist.is_initialized()


@pytest.mark.parametrize("variables, message", [
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
     r"RANK, WORLD_SIZE, LOCAL_RANK are set, as torchrun sets them, but MASTER_ADDR and MASTER_PORT are not; launch "
     r"with torchrun .*, or unset RANK, WORLD_SIZE, LOCAL_RANK to run one process"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     r"the environment variable LOCAL_RANK='x' is not a rank or size"),
    ({"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     r"RANK=3 and WORLD_SIZE=2 describe no process of the group"),
])
def test_torchrun_variables_left_in_a_shell_are_named_before_anything_runs(variables, message, write_config,
                                                                           monkeypatch, capsys):
    path, run = write_config()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnres train: error: ") and err.count("\n") == 1 and re.search(message, err), err
    assert not dist.is_initialized() and not Path(run["out_dir"]).exists()


def test_collectives_on_two_ranks(tmp_path_factory, corpus_dir):  # noqa: F811
    runs = shared_runs(tmp_path_factory, corpus_dir)
    seen = [json.loads((runs.root / f"env.{rank}").read_text()) for rank in range(2)]
    for rank, record in enumerate(seen):
        assert record["rank"] == rank and record["world_size"] == 2 and record["is_main"] == (rank == 0)
        assert record["mean"] == pytest.approx(1.5)  # mean of 1 and 2
        assert record["gathered"] == [0, 10]
        assert record["main_first"] == rank
    # rank 0's failure reaches rank 1 instead of leaving it waiting
    assert seen[0]["propagated"] == "ValueError: rank 0 could not prepare"
    assert seen[1]["propagated"].startswith("RuntimeError: rank 0 failed")
