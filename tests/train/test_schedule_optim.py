"""Learning-rate schedules and AdamW parameter groups."""

import math

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.train import TrainConfig
from attnres.train.optim import adamw, build_optimizer, parameter_groups
from attnres.train.schedule import build_scheduler, lr_factor


def test_cosine_warmup_peak_and_floor():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4, schedule="cosine")
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(99, cfg) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_factor(int(mid), cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * int(mid - 10) / 89)))
    values = [lr_factor(s, cfg) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_wsd_is_stable_then_decays_linearly():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=0.0, schedule="wsd", decay_fraction=0.2)
    assert [lr_factor(s, cfg) for s in (10, 50, 79)] == [1.0, 1.0, 1.0]
    assert lr_factor(80, cfg) == pytest.approx(1 - 1 / 20)
    assert lr_factor(89, cfg) == pytest.approx(0.5)
    assert lr_factor(99, cfg) == pytest.approx(0.0)


def test_constant_after_warmup():
    cfg = TrainConfig(steps=50, warmup_steps=0, schedule="constant")
    assert {lr_factor(s, cfg) for s in range(50)} == {1.0}


def model(**kw):
    return AttnResLM(ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                 intermediate_size=32, **kw))


def test_parameter_groups():
    m = model(residual="delta_block", residual_options={"num_blocks": 2, "exact_conversion": "gate"})
    groups = {k: [n for n, _ in v] for k, v in parameter_groups(m).items()}
    assert all(n.startswith("residual.routers.") for n in groups["routing"])
    assert any(n.endswith(".query") for n in groups["routing"]) and any(n.endswith(".gate") for n in groups["routing"])
    assert "embed_tokens.weight" in groups["no_decay"] and "lm_head.weight" not in sum(groups.values(), [])
    assert all(n.endswith("norm.weight") or n == "embed_tokens.weight" for n in groups["no_decay"])
    assert all(n.endswith("proj.weight") for n in groups["decay"])
    total = sum(len(v) for v in groups.values())
    assert total == len(list(m.parameters()))
    untied = model(tie_embeddings=False)
    assert "lm_head.weight" in [n for n, _ in parameter_groups(untied)["decay"]]


def test_optimizer_lr_multiplier_and_decay_and_schedule():
    m = model(residual="block_attnres", residual_options={"num_blocks": 2})
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, routing_lr_mult=100.0, weight_decay=0.1, warmup_steps=2, steps=10)
    opt = build_optimizer(m, cfg)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["decay"]["weight_decay"] == 0.1 and by_name["no_decay"]["weight_decay"] == 0.0
    assert by_name["routing"]["weight_decay"] == 0.0
    sched = build_scheduler(opt, cfg)
    assert by_name["routing"]["lr"] == pytest.approx(0.1 * 0.5) and by_name["decay"]["lr"] == pytest.approx(1e-3 * 0.5)
    for _ in range(9):
        opt.step()
        sched.step()
    assert by_name["routing"]["lr"] == pytest.approx(1e-2) and by_name["decay"]["lr"] == pytest.approx(1e-4)
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])


def test_adamw_takes_the_fused_kernel_and_updates_as_the_per_tensor_loop_does():
    torch.manual_seed(0)
    block = dict(residual="block_attnres", residual_options={"num_blocks": 2})
    fast, loop = model(**block), model(**block)
    loop.load_state_dict(fast.state_dict())
    opt_fast = adamw(fast.parameters(), lr=1e-2, weight_decay=0.1)
    opt_loop = torch.optim.AdamW(loop.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    assert opt_fast.defaults["fused"] is True
    ids = torch.randint(0, 50, (2, 8))
    for _ in range(3):
        for m, opt in ((fast, opt_fast), (loop, opt_loop)):
            opt.zero_grad()
            m(ids, labels=ids).loss.backward()
            opt.step()
    for (name, a), b in zip(fast.named_parameters(), loop.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_kimi_delta_attention_decay_rates_are_not_weight_decayed():
    from attnres import AttnResLM, ModelConfig
    from attnres.train.optim import parameter_groups

    model = AttnResLM(ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=2,
                                  intermediate_size=32, kda={"num_heads": 2, "head_dim": 4},
                                  layer_types=["linear_attention", "full_attention"]))
    groups = {key: [name for name, _ in value] for key, value in parameter_groups(model).items()}
    assert "layers.0.self_attn.forget_gate.A_log" in groups["no_decay"]
    assert "layers.0.self_attn.conv1d.weight" in groups["decay"]  # a filter is a weight
