"""Fast generation refuses, before allocating it, a static cache that cannot fit beside the weights, and
names the most new tokens that would (attnres.model.memory_need)."""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.common.errors import InputError
from attnres.generation import FastGenerator
from attnres.model import memory_need
from attnres.model.memory_need import cache_bytes

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                     residual="block_attnres", residual_options={"num_blocks": 2}, max_seq_len=4096)


def test_a_cache_beyond_the_machine_is_refused_with_the_tokens_that_fit(monkeypatch):
    model = AttnResLM(CONFIG).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setattr(memory_need, "machine_memory_bytes",
                        lambda device: weights + cache_bytes(model, 1, 256, torch.float32))  # room for 256 positions
    generator, prompt = FastGenerator(model, compile=False), torch.randint(0, 64, (1, 6))
    with pytest.raises(InputError, match=r"^max_new_tokens=300: a static cache of 320 positions for 1 row\(s\) "
                                         r"\([\d.]+ GiB\) and the weights \([\d.]+ GiB\) need [\d.]+ GiB, more than "
                                         r"the [\d.]+ GiB of memory this machine has; ask for at most 250 new tokens$"):
        generator.generate(prompt, 300)
    assert generator.generate(prompt, 250).sequences.shape == (1, 256)  # what the message offers fits
