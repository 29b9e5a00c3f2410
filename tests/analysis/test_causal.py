"""The causal check of routing (attnres.analysis.causal) on models where the answer is known."""

import math

import pytest
import torch

from attnres.analysis.causal import ablated_source, collect_causal_routing, rank_correlation, summarize_causal_routing
from tests.analysis.models import batches_of_different_sizes, randomize_routers, tiny_model


def test_rank_correlation_is_spearmans_rho_with_average_ranks_for_ties():
    assert rank_correlation([0.1, 0.2, 0.3, 0.9], [1.0, 5.0, 7.0, 8.0]) == pytest.approx(1.0)
    assert rank_correlation([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # ties: x ranks (1, 2.5, 2.5, 4), y ranks (1, 2, 3, 4); Pearson of the ranks, by hand
    rx, ry = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    mx, my = sum(rx) / 4, sum(ry) / 4
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    expected = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert rank_correlation([1.0, 2.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(expected)
    assert rank_correlation([0.5, 0.5, 0.5], [1.0, 2.0, 3.0]) is None  # constant mass: undefined
    assert rank_correlation([0.2, 0.8], [1.0, 2.0]) is None  # two points always give +-1
    with pytest.raises(ValueError, match="paired"):
        rank_correlation([1.0, 2.0, 3.0], [1.0, 2.0])


def silent_sublayers(model):
    """Every sub-layer's output projection zero: every delta is 0, so only the embedding carries signal."""
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def test_with_silent_sublayers_only_the_final_routers_embedding_matters():
    """Full AttnRes whose sub-layers all output zero: a sub-layer's input changes nothing downstream,
    and every source but the embedding is zero. So ablating anything anywhere has no effect at all,
    exactly, except the embedding at the final router, whose output is the model's hidden state."""
    model = tiny_model("full_attnres", num_layers=2)
    silent_sublayers(model)
    randomize_routers(model)
    batches = batches_of_different_sizes()
    clean, results = collect_causal_routing(model, batches)
    final = len(model.routers) - 1
    assert [r.router for r in results] == list(range(final + 1))
    for result in results:
        assert result.source_names == model.residual.source_names()[result.router]
        assert sum(result.mass) == pytest.approx(1.0)
        for kind in ("zero", "mean"):
            for i, effect in enumerate(result.effect[kind]):
                if result.router == final and i == 0:
                    assert abs(effect) > 1e-3, (kind, effect)  # the hidden state loses its only signal
                else:
                    assert effect == 0.0, (result.router, i, kind, effect)
    last = results[final]
    assert last.rank_correlation["zero"] == pytest.approx(rank_correlation(last.mass, last.effect["zero"]))
    assert math.isfinite(clean)


def test_an_ablation_reaches_one_router_only_and_is_undone():
    model = tiny_model("delta_attnres", num_layers=2).eval()
    randomize_routers(model)
    ids = batches_of_different_sizes()[1]
    model.residual.impl = "reference"

    def inputs_seen(run):
        seen = {}
        hooks = [r.register_forward_pre_hook(lambda m, args, k=k: seen.setdefault(k, [v.clone() for v in args[0]]))
                 for k, r in enumerate(model.routers)]
        try:
            return run(), seen
        finally:
            for hook in hooks:
                hook.remove()

    with torch.no_grad():
        clean, clean_inputs = inputs_seen(lambda: model(ids).logits)
        with ablated_source(model, 2, 1, "mean"):  # registered first, so the observers see its result
            ablated, ablated_inputs = inputs_seen(lambda: model(ids).logits)
        assert torch.equal(model(ids).logits, clean)  # the hook is gone
    assert not torch.equal(ablated, clean)
    for r in range(2):  # routers before 2 see what they saw
        assert all(torch.equal(a, b) for a, b in zip(ablated_inputs[r], clean_inputs[r]))
    mean = clean_inputs[2][1].mean(dim=(0, 1), keepdim=True).expand_as(clean_inputs[2][1])
    assert torch.equal(ablated_inputs[2][1], mean)
    assert all(torch.equal(ablated_inputs[2][i], clean_inputs[2][i]) for i in (0, 2))
    # router 3 reads sub-layer 2's output, which saw the ablated input
    assert not torch.equal(ablated_inputs[3][3], clean_inputs[3][3])
    assert torch.equal(ablated_inputs[3][1], clean_inputs[3][1])  # the source itself is untouched for it


def test_a_chosen_subset_of_routers_and_the_summary():
    model = tiny_model("block_attnres", num_blocks=2, num_layers=2)
    randomize_routers(model)
    clean, results = collect_causal_routing(model, batches_of_different_sizes(), routers=[3, 4], kinds=("zero",))
    assert [r.router for r in results] == [3, 4] and set(results[0].effect) == {"zero"}
    summary = summarize_causal_routing(results)
    values = [r.rank_correlation["zero"] for r in results if r.rank_correlation["zero"] is not None]
    assert summary["zero"]["routers"] == len(values)
    if values:
        assert summary["zero"]["mean_rank_correlation"] == pytest.approx(sum(values) / len(values))
    with pytest.raises(ValueError, match="router index 9 out of range"):
        collect_causal_routing(model, batches_of_different_sizes(), routers=[9])
    with pytest.raises(ValueError, match="ablation kind must be one of"):
        collect_causal_routing(model, batches_of_different_sizes(), kinds=("noise",))
    assert model.residual.impl == "auto" and model.training  # restored
