"""DDP and FSDP2 on 2 CPU ranks (gloo) train like one process; the parallel settings are checked."""

import json

import pytest
import torch

from attnres.distributed.data_parallel import local_rows
from attnres.train.train_config import resolve_parallel
from attnres.distributed.env import DistributedEnv
from attnres.train import TrainConfig, TrainConfigError
from tests.distributed.dp_runs import BF16_RTOL, FP32_RTOL, KIMI_RTOL, STEPS, assert_close, losses, shared_runs
from tests.train.conftest import corpus_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir):  # noqa: F811
    return shared_runs(tmp_path_factory, corpus_dir)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("kind", ["standard", "routed", "kimi"])
def test_losses_match_one_process(runs, mode, kind):
    """Losses, gradient norms and validation losses of all 10 steps within FP32_RTOL (fp32); for Kimi
    Linear also each step's expert imbalance (loads summed over ranks, biases moved alike)."""
    ref, par = runs.dir(f"ref_{kind}"), runs.dir(f"{mode}_{kind}")
    assert [s for s, _ in losses(par)] == list(range(1, STEPS + 1))  # rank 0 wrote each step once
    for key in ("loss", "grad_norm", "val_loss") + (("moe/imbalance",) if kind == "kimi" else ()):
        assert_close(losses(par, key), losses(ref, key), KIMI_RTOL if kind == "kimi" else FP32_RTOL)
    assert losses(par)[-1][1] < losses(par)[0][1]  # it learned


def test_fsdp_keeps_scalar_gates_replicated_and_matches(runs):
    """fully_shard cannot shard 0-dim gates: they stay whole, their gradients averaged by hand,
    and the global clipping norm combines them with the sharded rest."""
    for key in ("loss", "grad_norm", "val_loss"):
        assert_close(losses(runs.dir("fsdp_gated"), key), losses(runs.dir("ref_gated"), key), FP32_RTOL)


def test_fsdp_shards_tied_embeddings_once_and_keeps_gates_whole(runs):
    for rank in range(2):
        seen = json.loads((runs.root / f"sharded.{rank}").read_text())
        assert seen["tied"]  # embedding and LM head are still one parameter
        assert seen["embed"] == ["DTensor", [64, 16], [32, 16]]  # global shape, this rank's half
        assert "lm_head.weight" not in seen["sharded"]  # listed once, under the embedding's name
        assert {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                "residual.routers.0.query"} <= set(seen["sharded"])
        assert seen["replicated"] == [f"residual.routers.{i}.gate" for i in range(2)]
        assert seen["replicated_listed"] == 2


def test_routing_diagnostics_under_fsdp_match(runs):
    for key in ("diag/hidden_rms", "diag/grad_rms", "diag/max_weight", "diag/entropy"):
        expected = losses(runs.dir("ref_routed"), key)
        assert expected, key
        assert_close(losses(runs.dir("fsdp_routed"), key), expected, FP32_RTOL)


def test_fsdp_bf16_mixed_precision_with_activation_checkpointing(runs):
    """bf16 (FSDP MixedPrecisionPolicy on sub-layers, autocast) with activation checkpointing
    tracks single-process bf16 autocast within BF16_RTOL."""
    for key in ("loss", "val_loss"):
        assert_close(losses(runs.dir("fsdp_bf16"), key), losses(runs.dir("ref_bf16"), key), BF16_RTOL)


def test_rank0_alone_writes_run_files(runs):
    run_dir = runs.dir("fsdp_routed")
    assert (run_dir / "config.yaml").is_file() and (run_dir / "tokenizer").is_dir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STEPS  # log_every=1: one line per step, not one per rank


def test_batch_size_not_divisible_by_world_size_is_a_clear_error(runs):
    for rank in range(2):
        message = (runs.root / f"batch_error.{rank}").read_text()
        assert message.startswith("TrainConfigError: train.batch_size=3 (the global batch) must be divisible "
                                  "by the world size 2")


def fake_env(world_size, rank=0):
    return DistributedEnv(rank, world_size, rank, torch.device("cpu"))


@pytest.mark.parametrize("parallel, env, expected", [
    ("auto", None, "none"), ("auto", fake_env(1), "none"), ("auto", fake_env(4), "ddp"),
    ("fsdp", fake_env(2), "fsdp"), ("ddp", fake_env(1), "ddp"), ("none", fake_env(1), "none"),
])
def test_resolve_parallel(parallel, env, expected):
    assert resolve_parallel(TrainConfig(parallel=parallel, batch_size=8), env) == expected


@pytest.mark.parametrize("parallel, env, pattern", [
    ("ddp", None, r"train.parallel='ddp' needs a process group: launch with `torchrun"),
    ("none", fake_env(2), r"train.parallel='none' with 2 processes would train 2 copies"),
    ("auto", fake_env(3), r"train.batch_size=8 \(the global batch\) must be divisible by the world size 3"),
])
def test_resolve_parallel_errors(parallel, env, pattern):
    with pytest.raises(TrainConfigError, match=pattern):
        resolve_parallel(TrainConfig(parallel=parallel, batch_size=8), env)


def test_parallel_field_is_validated():
    assert TrainConfig().parallel == "auto"
    with pytest.raises(TrainConfigError, match=r"TrainConfig.parallel must be one of \['auto', 'none', 'ddp', "
                                               r"'fsdp', 'pipeline'\], got 'zero'"):
        TrainConfig(parallel="zero")


def test_local_rows_partition_the_global_batch():
    batch = torch.arange(6 * 3).view(6, 3)
    parts = [local_rows(batch, fake_env(3, rank)) for rank in range(3)]
    assert [p.shape for p in parts] == [(2, 3)] * 3
    assert torch.equal(torch.cat(parts), batch)
    assert local_rows(batch, None) is batch
