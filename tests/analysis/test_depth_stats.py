"""collect_depth_stats on cases with known answers: uniform routing, hand-set embeddings, manual loops."""

import json
import math

import pytest
import torch

from attnres.analysis import DepthStats, collect_depth_stats, mean_max_weight
from tests.analysis.models import batches_of_different_sizes, randomize_routers
from tests.analysis.models import tiny_model as _tiny_model


def tiny_model(residual, num_blocks=None, seed=0):
    return _tiny_model(residual, num_blocks, seed, num_layers=3)


VARIANTS = [("standard", None), ("full_attnres", None), ("block_attnres", 3), ("delta_attnres", None),
            ("delta_block", 2), ("denseformer", None),
            ("hyper_connections", None), ("mhc", None)]


def manual_hidden_inputs(model, ids):
    """h_0 .. h_{2L-1} and the final hidden state, by calling the model's pieces in forward's order."""
    embedding = model.embed_tokens(ids)
    rope = model.rotary(torch.arange(ids.shape[1]), embedding.dtype)
    state = model.residual.start(embedding)
    hs = []
    for i, layer in enumerate(model.layers):
        hs.append(model.residual.sublayer_input(2 * i, state))
        model.residual.after(2 * i, state, layer.attention_delta(hs[-1], rope))
        hs.append(model.residual.sublayer_input(2 * i + 1, state))
        model.residual.after(2 * i + 1, state, layer.mlp_delta(hs[-1]))
    return hs + [model.residual.finish(state)]


def start_weights(residual, r, n, num_mixers):
    """Mixer r's weights at initialisation: uniform for routers, the identity on the last state for
    DenseFormer, a_pre = e_{r mod n} (the final sum: ones) for hyper-connections; None for mHC."""
    if residual == "denseformer":
        return [0.0] * (n - 1) + [1.0]
    if residual == "hyper_connections":
        return [1.0] * n if r == num_mixers - 1 else [float(k == r % n) for k in range(n)]
    if residual == "mhc":  # drawn projections: sigmoid weights around 1/2, checked below
        return None
    return [1 / n] * n


@pytest.mark.parametrize("residual, num_blocks", VARIANTS[1:])
def test_zero_queries_give_uniform_weights(residual, num_blocks):
    """Routers start uniform (zero queries); DenseFormer's averages start at the identity on the last state."""
    model = tiny_model(residual, num_blocks)  # router queries are initialised to zero
    stats = collect_depth_stats(model, batches_of_different_sizes())
    assert stats.source_names == model.residual.source_names()
    assert len(stats.mean_weights) == len(model.routers)
    for r, (names, weights, top) in enumerate(zip(stats.source_names, stats.mean_weights, stats.max_weight)):
        n = len(names)
        expected = start_weights(residual, r, n, len(model.routers))
        if expected is None:
            assert all(0.2 < w < 0.8 for w in weights)
            continue
        assert weights == pytest.approx(expected, abs=1e-7)
        assert top is None if n == 1 else top == pytest.approx(max(expected), abs=1e-7)


def test_standard_hidden_rms_from_hand_set_embeddings():
    # Zero output projections make every sub-layer's delta zero, so every h_s is the embedding:
    # tokens 0 and 1 embed as all-1 and all-3 vectors, so each RMS is sqrt((1 + 9) / 2) = sqrt(5).
    model = tiny_model("standard")
    with torch.no_grad():
        model.embed_tokens.weight[0] = 1.0
        model.embed_tokens.weight[1] = 3.0
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    stats = collect_depth_stats(model, [torch.tensor([[0, 1]]), torch.tensor([[1, 0], [0, 1]])])
    assert stats.source_names == [] and stats.mean_weights == [] and stats.max_weight == []
    assert stats.num_tokens == 6
    assert stats.hidden_rms == pytest.approx([math.sqrt(5)] * 7, rel=1e-6)


@pytest.mark.parametrize("residual, num_blocks", VARIANTS)
def test_hidden_rms_equals_manual_loop_over_batches_of_different_sizes(residual, num_blocks):
    model = tiny_model(residual, num_blocks)
    randomize_routers(model)
    batches = batches_of_different_sizes()
    stats = collect_depth_stats(model, batches)
    with torch.no_grad():
        per_batch = [manual_hidden_inputs(model, ids) for ids in batches]
    expected = [math.sqrt(sum(float(hs[s].double().pow(2).sum()) for hs in per_batch)
                          / sum(hs[s].numel() for hs in per_batch)) for s in range(7)]
    assert len(stats.hidden_rms) == 2 * 3 + 1
    assert stats.hidden_rms == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("residual, num_blocks", [("block_attnres", 3), ("delta_attnres", None)])
def test_weights_are_averaged_over_tokens_not_batches(residual, num_blocks):
    model = tiny_model(residual, num_blocks)
    randomize_routers(model)
    batches = batches_of_different_sizes()  # 5 and 21 tokens: a per-batch mean would differ
    stats = collect_depth_stats(model, batches)
    with torch.no_grad():
        routing = [model(ids, return_routing=True).routing for ids in batches]
    for r in range(len(model.routers)):
        tokens = torch.cat([out[r].flatten(0, 1) for out in routing]).double()  # (26, n_sources)
        assert stats.mean_weights[r] == pytest.approx(tokens.mean(0).tolist(), abs=1e-7)
        assert sum(stats.mean_weights[r]) == pytest.approx(1.0, abs=1e-6)
        expected_max = None if tokens.shape[1] == 1 else float(tokens.amax(-1).mean())
        assert stats.max_weight[r] == pytest.approx(expected_max, abs=1e-7)
    # The per-batch values really differ, so the test above can tell the two weightings apart.
    per_batch = [mean_max_weight(out) for out in routing]
    assert any(a is not None and abs(a - b) > 1e-4 for a, b in zip(*per_batch))


def test_hooks_removed_and_training_flag_restored():
    model = tiny_model("block_attnres", 3)
    norms = [model.norm] + [n for layer in model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    model.train()
    collect_depth_stats(model, batches_of_different_sizes())
    assert model.training
    assert all(len(n._forward_pre_hooks) == 0 for n in norms)
    model.eval()
    collect_depth_stats(model, batches_of_different_sizes())
    assert not model.training


def test_hooks_removed_when_forward_raises():
    model = tiny_model("delta_block", 2).train()
    bad = torch.tensor([[1, 2, 99]])  # 99 is outside vocab_size=64
    with pytest.raises(ValueError, match="vocab_size"):
        collect_depth_stats(model, [torch.tensor([[1, 2]]), bad])
    assert model.training
    assert len(model.norm._forward_pre_hooks) == 0
    assert all(len(layer.input_layernorm._forward_pre_hooks) == 0 for layer in model.layers)


def test_no_tokens_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        collect_depth_stats(tiny_model("standard"), [])


def test_to_dict_round_trips_through_json():
    stats = collect_depth_stats(tiny_model("full_attnres"), batches_of_different_sizes())
    data = json.loads(json.dumps(stats.to_dict()))
    assert DepthStats.from_dict(data) == stats
    assert data["max_weight"][0] is None  # router 0 sees only the embedding
