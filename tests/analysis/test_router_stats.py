"""Routing entropy, effective number of sources and their summaries on weights with known answers."""

import math

import pytest
import torch

from attnres.analysis import (DepthStats, collect_depth_stats, effective_sources, mean_max_weight, routing_entropy,
                              summarize_routers)
from tests.analysis.models import batches_of_different_sizes, randomize_routers, tiny_model


def test_one_hot_rows_have_zero_entropy_and_one_source():
    weights = torch.zeros(2, 3, 4)
    for b in range(2):
        for t in range(3):
            weights[b, t, (b + t) % 4] = 1.0  # the chosen source differs by token
    entropy = routing_entropy(weights)
    assert entropy.shape == (2, 3)
    assert torch.equal(entropy, torch.zeros(2, 3))  # 0 ln 0 = 0 exactly, no NaN
    assert torch.equal(effective_sources(weights), torch.ones(2, 3))


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_uniform_rows_give_log_n_and_n(n):
    weights = torch.full((2, 5, n), 1 / n)
    assert torch.allclose(routing_entropy(weights), torch.full((2, 5), math.log(n)), atol=1e-6)
    assert torch.allclose(effective_sources(weights), torch.full((2, 5), float(n)), atol=1e-5)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_two_sources_match_the_closed_form(p):
    weights = torch.tensor([[[p, 1 - p]]], dtype=torch.float64)
    expected = -sum(q * math.log(q) for q in (p, 1 - p) if q > 0)
    assert routing_entropy(weights).item() == pytest.approx(expected, abs=1e-12)
    assert effective_sources(weights).item() == pytest.approx(math.exp(expected), abs=1e-12)


def test_mixed_rows_and_zero_weights():
    weights = torch.tensor([[[0.5, 0.25, 0.25], [0.5, 0.5, 0.0]]])
    # H([1/2, 1/4, 1/4]) = 1.5 ln 2, so 2^1.5 effective sources; a zero weight adds nothing.
    assert routing_entropy(weights).tolist()[0] == pytest.approx([1.5 * math.log(2), math.log(2)], abs=1e-6)
    assert effective_sources(weights).tolist()[0] == pytest.approx([2 ** 1.5, 2.0], abs=1e-6)


def test_low_precision_weights_are_computed_in_fp32():
    weights = torch.tensor([[[0.5, 0.25, 0.25]]])
    assert routing_entropy(weights.bfloat16()).dtype == torch.float32
    assert routing_entropy(weights.double()).dtype == torch.float64
    assert routing_entropy(weights.bfloat16()).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)


def test_empty_source_axis_is_an_error():
    with pytest.raises(ValueError, match="source"):
        routing_entropy(torch.zeros(2, 3, 0))


def test_summary_of_hand_built_routers():
    single = torch.ones(2, 3, 1)
    uniform = torch.full((1, 2, 4), 0.25)
    # Token 0 picks one source (H = 0, 1 source), token 1 is uniform over 4 (H = ln 4, 4 sources):
    # the mean of exp(H) is 2.5, not exp(mean H) = 2.
    mixed = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    first, second, third = summarize_routers([single, uniform, mixed])

    assert (first.num_sources, first.entropy, first.effective_sources) == (1, 0.0, 1.0)
    assert first.max_weight is None and first.normalized_entropy is None

    assert second.num_sources == 4
    assert second.entropy == pytest.approx(math.log(4), abs=1e-6)
    assert second.effective_sources == pytest.approx(4.0, abs=1e-5)
    assert second.max_weight == pytest.approx(0.25)
    assert second.normalized_entropy == pytest.approx(1.0, abs=1e-6)

    assert third.entropy == pytest.approx(math.log(4) / 2, abs=1e-6)
    assert third.effective_sources == pytest.approx(2.5, abs=1e-5)
    assert third.max_weight == pytest.approx(0.625)
    assert third.normalized_entropy == pytest.approx(0.5, abs=1e-6)
    assert [s.max_weight for s in (first, second, third)] == pytest.approx(mean_max_weight([single, uniform, mixed]))


def test_summary_of_a_real_forward():
    model = tiny_model("delta_attnres")
    randomize_routers(model)
    with torch.no_grad():
        routing = model(batches_of_different_sizes()[1], return_routing=True).routing
    summaries = summarize_routers(routing)
    assert [s.num_sources for s in summaries] == [len(n) for n in model.residual.source_names()]
    for s, w in zip(summaries, routing):
        assert s.entropy == pytest.approx(float(routing_entropy(w).double().mean()), rel=1e-9)
        assert 1.0 - 1e-6 <= s.effective_sources <= s.num_sources + 1e-5
    assert any(s.normalized_entropy is not None and s.normalized_entropy < 0.99 for s in summaries)


@pytest.mark.parametrize("residual, num_blocks", [("full_attnres", None), ("block_attnres", 2), ("delta_block", 2)])
def test_depth_stats_entropy_at_zero_queries(residual, num_blocks):
    stats = collect_depth_stats(tiny_model(residual, num_blocks), batches_of_different_sizes())
    n = [len(names) for names in stats.source_names]
    assert stats.entropy == pytest.approx([math.log(k) for k in n], abs=1e-6)
    assert stats.effective_sources == pytest.approx([float(k) for k in n], abs=1e-5)


def test_depth_stats_entropy_is_averaged_over_tokens_not_batches():
    model = tiny_model("block_attnres", 2)
    randomize_routers(model)
    batches = batches_of_different_sizes()  # 5 and 21 tokens
    stats = collect_depth_stats(model, batches)
    with torch.no_grad():
        routing = [model(ids, return_routing=True).routing for ids in batches]
    for r in range(len(model.routers)):
        tokens = torch.cat([out[r].flatten(0, 1) for out in routing])  # (26, n)
        entropy = routing_entropy(tokens).double()
        assert stats.entropy[r] == pytest.approx(float(entropy.mean()), abs=1e-7)
        assert stats.effective_sources[r] == pytest.approx(float(entropy.exp().mean()), abs=1e-6)
    per_batch = [[s.entropy for s in summarize_routers(out)] for out in routing]
    assert any(abs(a - b) > 1e-4 for a, b in zip(*per_batch))  # a per-batch mean would differ


def test_depth_stats_standard_has_no_entropy_and_old_dicts_still_load():
    stats = collect_depth_stats(tiny_model("standard"), batches_of_different_sizes())
    assert stats.entropy == [] and stats.effective_sources == []
    old = collect_depth_stats(tiny_model("full_attnres"), batches_of_different_sizes()).to_dict()
    assert len(old.pop("entropy")) == 5 and len(old.pop("effective_sources")) == 5
    loaded = DepthStats.from_dict(old)
    assert loaded.entropy == [] and loaded.effective_sources == []


def test_entropy_of_unnormalised_sigmoid_weights_is_that_of_their_shares():
    sigmoid = torch.tensor([[0.9, 0.9], [0.1, 0.3], [0.5, 0.0]])
    shares = sigmoid / sigmoid.sum(-1, keepdim=True)
    torch.testing.assert_close(routing_entropy(sigmoid), routing_entropy(shares))
    torch.testing.assert_close(routing_entropy(sigmoid)[0], torch.tensor(math.log(2)))
    assert routing_entropy(sigmoid)[2] == 0.0  # all the mass on one source


def test_rows_with_negative_weights_have_no_entropy():
    weights = torch.tensor([[0.5, 0.5], [-0.2, 1.2]])
    entropy = routing_entropy(weights)
    assert entropy[0] == pytest.approx(math.log(2)) and math.isnan(entropy[1])
