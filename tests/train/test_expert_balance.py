"""The trainer balances a mixture of experts after every step (attnres.model.moe_balance): it moves
the score biases, logs the step's imbalance per MoE layer, and checkpoints the biases."""

import pytest
import torch

from attnres.checkpoint import checkpoint_dirs
from attnres.model.moe_balance import expert_routers
from attnres.train import load_run_config, train
from attnres.train.evaluate import load_checkpoint
from attnres.train.metrics import read_metrics
from attnres.train.train_config import TrainConfigError

MOE = "model.moe={num_experts: 4, experts_per_token: 2, expert_size: 16, scoring: sigmoid, score_bias: true}"


def test_training_updates_the_biases_logs_the_imbalance_and_checkpoints_them(write_config):
    path, run = write_config(steps=4, checkpoint_every=4, expert_balance_rate=0.01)
    result = train(load_run_config(path, [MOE]))
    records = [r for r in read_metrics(result.run_dir) if "loss" in r]
    assert len(records) == 4
    for record in records:
        assert len(record["moe/imbalance"]) == 2 and 1.0 <= record["moe/imbalance_max"] <= 4.0
    biases = [r.score_bias for r in expert_routers(result.model)]
    # Each step moves every bias by 0 or +-rate: 4 steps give a multiple of 0.01 of at most 0.04.
    for bias in biases:
        steps = bias / 0.01
        assert torch.allclose(steps, steps.round(), atol=1e-5) and bias.abs().max() <= 0.04 + 1e-6
    assert any(bias.abs().sum() > 0 for bias in biases)
    restored = load_checkpoint(checkpoint_dirs(result.run_dir / "checkpoints")[-1]).model  # what a resumed run starts from
    for got, want in zip(expert_routers(restored), biases, strict=True):
        assert torch.equal(got.score_bias, want)


def test_rate_zero_leaves_the_biases_at_zero(write_config):
    path, run = write_config(steps=2, checkpoint_every=2, expert_balance_rate=0.0)
    result = train(load_run_config(path, [MOE]))
    assert all(r.score_bias.abs().sum() == 0 for r in expert_routers(result.model))


def test_a_negative_rate_is_refused_by_name(write_config):
    path, run = write_config(expert_balance_rate=-1.0)
    with pytest.raises(TrainConfigError, match=r"TrainConfig\.expert_balance_rate must be a number >= 0"):
        load_run_config(path, [])
