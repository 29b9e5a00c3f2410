"""KVCache: preallocated per-layer buffers written in place; views of the filled part; growth keeps content."""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.model import KVCache
from attnres.model.cache import MIN_CAPACITY, cached_length


def kv(batch=2, heads=3, length=1, dim=4, start=0.0):
    k = torch.arange(batch * heads * length * dim, dtype=torch.float32).view(batch, heads, length, dim) + start
    return k, -k


def test_positions_are_written_in_place_into_a_preallocated_buffer():
    cache = KVCache()
    k, v = kv(length=5)
    keys, values = cache.update(k, v, 0)
    buffer = cache.keys[0]
    assert buffer.shape == (2, 3, MIN_CAPACITY, 4)  # allocated once, larger than what is held
    assert torch.equal(keys, k) and torch.equal(values, v)
    for step in range(10):  # decoding: one position at a time, no new storage
        k1, v1 = kv(length=1, start=100.0 + step)
        keys, values = cache.update(k1, v1, 0)
        assert cache.keys[0].data_ptr() == buffer.data_ptr()
        assert keys.data_ptr() == buffer.data_ptr() and keys.shape[2] == 6 + step  # a view of the filled part
        assert torch.equal(keys[:, :, -1:], k1) and torch.equal(values[:, :, -1:], v1)
    assert cache.get_seq_length() == 15 and cache.get_seq_length(1) == 0


def test_growth_doubles_and_keeps_every_position():
    cache = KVCache()
    written = [kv(length=40, start=0.0), kv(length=40, start=1000.0)]
    for k, v in written:
        keys, values = cache.update(k, v, 0)
    assert cache.keys[0].shape[2] == 128  # 80 positions: 64 doubled once
    assert torch.equal(keys, torch.cat([k for k, _ in written], dim=2))
    assert torch.equal(values, torch.cat([v for _, v in written], dim=2))


def test_max_len_allocates_once_and_refuses_more():
    cache = KVCache(max_len=7)
    cache.update(*kv(length=3), 0)
    assert cache.keys[0].shape[2] == 7
    cache.update(*kv(length=4), 0)
    with pytest.raises(ValueError, match=r"at most max_len=7 positions, 8 were asked for"):
        cache.update(*kv(length=1), 0)
    with pytest.raises(ValueError, match="max_len must be None or a positive integer"):
        KVCache(max_len=0)


def test_layers_fill_independently_and_decoding_through_the_model_reuses_storage():
    torch.manual_seed(0)
    model = AttnResLM(ModelConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                  intermediate_size=48, residual="block_attnres",
                                  residual_options={"num_blocks": 2})).eval()
    ids = torch.randint(0, 50, (1, 9))
    cache = KVCache(max_len=9)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        pointers = [k.data_ptr() for k in cache.keys.values()]
        logits = [model(ids[:, t:t + 1], cache=cache).logits for t in range(4, 9)]
        full = model(ids).logits
    assert [k.data_ptr() for k in cache.keys.values()] == pointers and cache.lengths == {0: 9, 1: 9}
    torch.testing.assert_close(torch.cat(logits, dim=1), full[:, 4:], rtol=1e-5, atol=1e-5)


class LayerLengths:
    """A cache as transformers 5.25 reports its length: per layer, where layer 0 is a linear-attention
    layer counting something else, and a static layer's count is a tensor."""

    def get_seq_length(self, layer_idx: int = 0):
        return torch.tensor([4, 7][layer_idx])


def test_the_cached_length_is_read_from_an_attention_layer_as_an_int():
    length = cached_length(LayerLengths(), 1)
    assert length == 7 and type(length) is int
    assert cached_length(None, 1) == 0


def test_a_kimi_linear_model_reads_its_cache_length_from_its_first_full_attention_layer():
    from tests.model.test_kimi_decoder import config_for

    model = AttnResLM(config_for(layer_types=["linear_attention", "linear_attention", "latent_attention",
                                              "latent_attention"])).eval()
    assert model.first_attention_layer == 2
    cache, ids = KVCache(), torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        model(ids, cache=cache)
        out = model(ids[:, :1], cache=cache, attention_mask=torch.ones(2, 6, dtype=torch.long))
    assert cache.get_seq_length(2) == 6 and out.logits.shape == (2, 1, 64)
