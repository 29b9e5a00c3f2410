"""What one decode step reads (attnres.generation.memory_traffic): every weight once, the input embedding
one row per row of the batch unless the head shares it, and the whole static KV cache."""

import math

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.generation import FastGenerator
from attnres.generation.memory_traffic import (cache_bytes_per_step, copy_bandwidth_gb_s, weight_bytes_per_step)


def config(tie: bool) -> ModelConfig:
    return ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=48, residual="block_attnres", residual_options={"num_blocks": 2},
                       max_seq_len=128, tie_embeddings=tie)


def test_an_untied_embedding_is_read_one_row_per_batch_row():
    model = AttnResLM(config(tie=False))
    everything = sum(p.numel() for p in model.parameters()) * 4
    table = 100 * 32 * 4
    assert weight_bytes_per_step(model, batch=1) == everything - table + 32 * 4
    assert weight_bytes_per_step(model, batch=3) == everything - table + 3 * 32 * 4


def test_a_tied_embedding_is_read_whole_once_by_the_head():
    model = AttnResLM(config(tie=True))
    assert weight_bytes_per_step(model) == sum(p.numel() for p in model.parameters()) * 4  # parameters() dedups


def test_a_transformers_model_is_counted_through_its_embedding_accessors():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False))
    everything = sum(p.numel() for p in llama.parameters()) * 4
    assert weight_bytes_per_step(llama) == everything - 100 * 32 * 4 + 32 * 4


def test_a_generation_reports_its_step_bytes_and_their_rate():
    model = AttnResLM(config(tie=False)).eval()
    result = FastGenerator(model, compile=False).generate(torch.randint(0, 100, (2, 5)), 6)
    capacity = 64  # 5 + 6 rounded up to a multiple of 64
    assert cache_bytes_per_step(2, 2, 2, 8, capacity, 4) == 2 * 2 * 2 * 2 * capacity * 8 * 4  # K, V x 2 layers
    expected = weight_bytes_per_step(model, 2) + cache_bytes_per_step(2, 2, 2, 8, capacity, 4)
    assert result.decode_bytes_per_step == expected
    assert result.decode_gb_per_s == pytest.approx(expected * result.decode_steps / result.decode_s / 1e9)


def test_the_copy_bandwidth_is_a_measured_rate():
    rate = copy_bandwidth_gb_s(repeats=2)
    assert math.isfinite(rate) and rate > 0
