"""Auxiliary-loss-free load balancing (attnres.model.moe_balance): routers count their loads in training
only (`ExpertRouter.take_loads`), each bias moves by the rate against its expert's excess load
(`update_bias`), and repeated updates spread a skewed router's tokens over its experts."""

import pytest
import torch

from attnres.analysis import load_imbalance
from attnres.model.moe import ExpertRouter
from attnres.model.moe_config import MoEConfig

CONFIG = MoEConfig(num_experts=4, experts_per_token=2, expert_size=8, scoring="sigmoid", score_bias=True)


def router(config: MoEConfig = CONFIG, seed: int = 0) -> ExpertRouter:
    torch.manual_seed(seed)
    r = ExpertRouter(16, config)
    torch.nn.init.normal_(r.weight, std=0.5)
    return r


def test_loads_are_counted_in_training_only_and_taken_once():
    r = router()
    x = torch.randn(10, 16)
    r.eval()
    r(x)
    assert r.take_loads().sum() == 0
    r.train()
    r(x)
    r(x[:3])
    loads = r.take_loads()
    assert loads.shape == (4,) and loads.sum() == (10 + 3) * 2
    assert r.take_loads().sum() == 0  # taken: counting starts again


def test_each_bias_moves_by_the_rate_against_its_excess_load():
    r = router()
    r.update_bias(torch.tensor([5.0, 1.0, 3.0, 3.0]), rate=0.01)
    assert r.score_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])
    r.update_bias(torch.tensor([0.0, 0.0, 0.0, 0.0]), rate=0.01)  # a router that did not run
    r.update_bias(torch.tensor([9.0, 1.0, 1.0, 1.0]), rate=0.0)  # balancing off
    assert r.score_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])


def test_a_router_without_a_bias_is_counted_but_never_changed():
    r = router(MoEConfig(num_experts=4, experts_per_token=2, expert_size=8))
    r.train()
    r(torch.randn(6, 16))
    loads = r.take_loads()
    r.update_bias(loads, rate=0.1)
    assert r.score_bias is None and loads.sum() == 12


def test_repeated_updates_spread_a_skewed_router_over_its_experts():
    r = router()
    with torch.no_grad():
        r.weight[:2, 0] += 2.0  # experts 0 and 1 score high on the inputs' common direction: they take most tokens
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(1))
    x[:, 0] += 3.0
    r.train()

    def imbalance() -> float:
        r(x)
        loads = r.take_loads()
        return loads, load_imbalance(loads.tolist())

    _, before = imbalance()
    history = []
    for _ in range(100):
        loads, now = imbalance()
        history.append(now)
        r.update_bias(loads, rate=0.01)
    # A fixed step cannot settle exactly: on one batch the loads end in a cycle of about the rate's size.
    assert before > 1.8 and max(history[-10:]) < 1.25, (before, history[-10:])
