"""How routing is computed is a run setting, not part of the model: a run resumes with another
routing implementation, and checkpoints do not record one."""

import json

import pytest

from attnres.checkpoint import checkpoint_dirs
from attnres.train import RunConfigError, load_run_config, train
from attnres.train.metrics import read_metrics
from tests.distributed.workers import copy_run
from tests.helpers import needs_fused_cpu


def losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


@needs_fused_cpu
def test_a_run_started_fused_resumes_lean_with_the_same_losses(write_config):
    path, run = write_config(routing_impl="fused")
    first = train(load_run_config(path))
    checkpoint = checkpoint_dirs(first.run_dir / "checkpoints")[0]
    config = json.loads((checkpoint / "config.json").read_text())
    assert not {"routing_impl", "routing_chunk_size"} & set(config)  # not part of the model
    resumed_dir = first.run_dir.parent / "resumed"
    copy_run(first.run_dir, resumed_dir, keep_step=4)
    resumed = train(load_run_config(path, [f"out_dir={resumed_dir}", "train.routing_impl=lean"]), resume=True)
    assert resumed.model.residual.impl == "lean"
    before, after = losses(first.run_dir), losses(resumed.run_dir)
    assert sorted(after) == list(range(1, 13))
    # fused and lean route the same function; fp32 rounding apart after 8 more steps
    assert [after[s] for s in range(5, 13)] == pytest.approx([before[s] for s in range(5, 13)], rel=1e-5, abs=1e-6)
    assert after[12] != before[4]  # it trained on


def test_the_routing_settings_are_checked_against_the_variant(write_config):
    path, _ = write_config()
    with pytest.raises(RunConfigError, match=r"train.routing_chunk_size applies only to per-sub-layer routing "
                                             r"\(full_attnres, delta_attnres; block variants"):
        load_run_config(path, ["train.routing_chunk_size=2"])
    with pytest.raises(RunConfigError, match=r"train.routing_impl='fused': residual='hyper_connections' does not "
                                             r"route with it; allowed values: \['auto', 'reference', 'lean'\]"):
        load_run_config(path, ["model.residual=hyper_connections", "model.num_blocks=null", "train.routing_impl=fused"])
