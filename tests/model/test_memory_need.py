"""Memory a model needs before it is allocated (attnres.model.memory_need): the static cache each token
mixer states matches what a real cache allocates, training counts four fp32 copies as the step-memory
measurement does, and a size beyond the machine is refused in one line with the estimate."""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.common.errors import InputError
from attnres.common.machine import machine_memory_bytes
from attnres.common.precision import autocast
from attnres.generation.memory_traffic import held_cache_bytes
from attnres.model import StaticKVCache
from attnres.model import memory_need
from attnres.model.memory_need import cache_bytes, check_fits, training_state_bytes
from attnres.train.memory import measure_step_memory
from tests.model.test_kimi_decoder import config_for as kimi_config

DENSE = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                    residual="block_attnres", residual_options={"num_blocks": 2}, max_seq_len=256)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("config", [DENSE, kimi_config()], ids=["attention", "kimi: delta + latent attention"])
def test_the_stated_cache_size_is_what_a_static_cache_allocates(config, precision):
    model = AttnResLM(config).eval()
    batch, capacity = 3, 128
    cache = StaticKVCache(capacity)
    with torch.no_grad(), autocast(torch.device("cpu"), precision):
        model(torch.randint(0, 64, (batch, 5)), cache=cache)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert cache_bytes(model, batch, capacity, dtype) == held_cache_bytes(cache)


def test_a_recurrent_state_does_not_grow_with_the_positions():
    delta = AttnResLM(kimi_config()).layers[0].self_attn  # Kimi Delta Attention
    assert delta.cache_bytes(2, 10, torch.float32) == delta.cache_bytes(2, 10_000, torch.float32) > 0


def test_training_counts_weights_gradients_and_two_adamw_moments_as_the_bench_measures_them():
    model = AttnResLM(DENSE)
    n = sum(p.numel() for p in model.parameters())
    assert training_state_bytes(n) == 16 * n
    measured = measure_step_memory(model, torch.randint(0, 64, (2, 8)), "fp32")
    assert measured["peak_bytes"] == training_state_bytes(n) + measured["activation_bytes"]


def test_the_machine_memory_is_read():
    total = machine_memory_bytes(torch.device("cpu"))
    assert total is None or total > 2 ** 28  # a Linux machine: its RAM, or its container's limit


def test_a_size_beyond_the_machine_is_refused_with_the_estimate(monkeypatch):
    monkeypatch.setattr(memory_need, "machine_memory_bytes", lambda device: 8 * 2 ** 30)
    with pytest.raises(InputError, match=r"^the weights need 12\.0 GiB, more than the 8\.0 GiB of memory this "
                                         r"machine has; use fewer$"):
        check_fits(12 * 2 ** 30, "the weights need", torch.device("cpu"), "use fewer")
    check_fits(8 * 2 ** 30, "the weights need", torch.device("cpu"), "use fewer")  # fits exactly: no error


def test_nothing_is_refused_where_the_memory_cannot_be_read(monkeypatch):
    monkeypatch.setattr(memory_need, "machine_memory_bytes", lambda device: None)
    check_fits(2 ** 60, "the weights need", torch.device("cpu"), "use fewer")
