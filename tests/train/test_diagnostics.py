"""Routing diagnostics during training: logged at the chosen interval, by depth, to JSONL and TensorBoard."""

import math

import pytest

from attnres.train import load_run_config, train
from attnres.train.train_config import TrainConfig, TrainConfigError
from attnres.train.metrics import MetricsLogger, read_metrics


@pytest.mark.parametrize("residual, num_blocks, routers", [("block_attnres", 2, 5), ("standard", None, 0)])
def test_diagnostics_are_logged_every_n_steps(write_config, residual, num_blocks, routers):
    path, run = write_config(steps=6, diagnostics_every=3, checkpoint_every=6)
    result = train(load_run_config(path, [f"model.residual={residual}", f"model.num_blocks={num_blocks or 'null'}"]))
    records = [r for r in read_metrics(result.run_dir) if "diag/hidden_rms" in r]
    assert [r["step"] for r in records] == [3, 6]
    for record in records:
        assert len(record["diag/hidden_rms"]) == 2 * 2 + 1  # 2L sub-layer inputs + the final hidden state
        assert len(record["diag/grad_rms"]) == 2 * 2
        assert all(math.isfinite(v) and v > 0 for v in record["diag/hidden_rms"] + record["diag/grad_rms"])
        if routers:
            assert len(record["diag/max_weight"]) == len(record["diag/entropy"]) == routers
            assert 0 < record["diag/max_weight_deep"] <= 1
            assert all(1 <= v <= 5 for v in record["diag/effective_sources"])
        else:
            assert "diag/max_weight" not in record


def test_a_mixture_of_experts_run_logs_its_expert_imbalance(write_config):
    path, run = write_config(steps=2, diagnostics_every=2, checkpoint_every=2)
    moe = "model.moe={num_experts: 4, experts_per_token: 2, expert_size: 16, dense_layers: 1}"
    result = train(load_run_config(path, [moe]))
    record = next(r for r in read_metrics(result.run_dir) if "diag/hidden_rms" in r)
    assert len(record["diag/expert_imbalance"]) == 1  # 2 layers, the first dense
    assert len(record["diag/expert_load"][0]) == 4 and sum(record["diag/expert_load"][0]) == pytest.approx(1.0)
    assert 1.0 <= record["diag/expert_imbalance_max"] <= 4.0


def test_off_by_default_and_validated():
    assert TrainConfig().diagnostics_every is None
    with pytest.raises(TrainConfigError, match="diagnostics_every must be a positive integer"):
        TrainConfig(diagnostics_every=0)


def test_lists_go_to_tensorboard_as_one_scalar_per_depth(tmp_path):
    logged = []

    class Recorder:
        def add_scalar(self, key, value, step):
            logged.append((key, value, step))

        def close(self):
            pass

    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger._writer = Recorder()
    logger.log({"step": 7, "loss": 2.5, "diag/entropy": [0.1, float("nan"), 0.3], "diag/max_weight": [None, 0.5]})
    assert logged == [("loss", 2.5, 7), ("diag/entropy/00", 0.1, 7), ("diag/entropy/02", 0.3, 7),
                      ("diag/max_weight/01", 0.5, 7)]
    assert read_metrics(tmp_path)[0]["diag/entropy"][0] == 0.1
