"""The feed-forward table (attnres.model.feed_forwards) and the FeedForward protocol: each layer's odd
sub-layer is built by its row, states its FLOPs, initialises what it holds, and balances itself after a
step; nothing outside the table asks whether a feed-forward is a mixture of experts."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import attnres
from attnres import AttnResLM
from attnres.model import ConfigError, FeedForward, MixtureOfExperts
from attnres.model.feed_forwards import FEED_FORWARDS, feed_forward_type
from attnres.model.mlp import MLP
from tests.model.test_kimi_decoder import config_for


def test_each_layer_gets_the_feed_forward_of_its_row():
    config = config_for()  # experts from layer 1 on
    assert set(FEED_FORWARDS) == {"dense", "moe"}
    assert [feed_forward_type(config, i) for i in range(4)] == ["dense", "moe", "moe", "moe"]
    model = AttnResLM(config)
    assert [type(layer.mlp) for layer in model.layers] == [MLP] + [MixtureOfExperts] * 3
    assert all(isinstance(layer.mlp, FeedForward) for layer in model.layers)
    with pytest.raises(ConfigError, match=r"ModelConfig.moe: dense_layers must be from 0 to num_layers=4, got 5"):
        config_for(moe=dataclasses.replace(config.moe, dense_layers=5))  # the row's check


def test_after_a_step_a_mixture_of_experts_reports_its_loads_and_moves_its_bias():
    torch.manual_seed(0)
    model = AttnResLM(config_for()).train()
    model(torch.randint(0, 64, (2, 8)))
    dense, experts = model.layers[0].mlp, model.layers[1].mlp
    assert dense.after_step(lambda t: t, rate=0.1) is None
    loads = experts.after_step(lambda t: 2 * t, rate=0.1)  # as if a second rank counted the same
    assert loads.shape == (4,) and loads.sum() == 2 * 2 * 8 * 2  # 2 ranks x 16 tokens x k = 2
    assert experts.gate.score_bias.abs().sum() > 0
    assert experts.after_step(lambda t: t, rate=0.1).sum() == 0  # taken: counting starts again


def test_a_feed_forward_states_its_flops():
    config = config_for()
    moe, mlp = MixtureOfExperts(16, config.moe), MLP(16, 32)
    assert mlp.flops_per_token() == 2 * 3 * 16 * 32
    assert moe.flops_per_token() == 2 * 16 * 4 + 2 * 2 * 3 * 16 * 8 + 2 * 3 * 16 * 8  # router, k = 2, shared


def test_no_module_outside_the_table_asks_whether_a_feed_forward_is_a_mixture_of_experts():
    root = Path(attnres.__file__).parent
    allowed = {"model/moe.py", "model/moe_balance.py", "model/feed_forwards.py"}
    asking = [path.relative_to(root).as_posix() for path in root.rglob("*.py")
              if path.relative_to(root).as_posix() not in allowed
              and re.search(r"isinstance\([^)]*(MixtureOfExperts|ExpertRouter)", path.read_text())]
    assert asking == []
