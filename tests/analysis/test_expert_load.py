"""Expert load (attnres.analysis.expert_load): the share of assignments each expert gets, per MoE layer,
and the imbalance (largest over mean) the balancing drives down."""

import math

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.analysis import collect_expert_loads, load_imbalance


def moe_model(**moe) -> AttnResLM:
    torch.manual_seed(0)
    return AttnResLM(ModelConfig(vocab_size=50, hidden_size=16, num_layers=3, num_heads=2, num_kv_heads=1,
                                 intermediate_size=32, moe={"num_experts": 4, "experts_per_token": 1,
                                                            "expert_size": 8, "dense_layers": 1, **moe}))


def test_a_layer_that_sends_every_token_to_one_expert_is_as_unbalanced_as_it_gets():
    model = moe_model(scoring="sigmoid", score_bias=True)
    with torch.no_grad():
        model.layers[2].mlp.gate.score_bias[3] = 100.0  # layer 2 picks expert 3 for every token
    batches = [torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(s)) for s in range(3)]
    model.train()
    loads = collect_expert_loads(model, batches)
    assert model.training  # left as found
    assert len(loads) == 2 and all(sum(layer) == pytest.approx(1.0) for layer in loads)  # layers 1 and 2
    assert loads[1] == [0.0, 0.0, 0.0, 1.0]
    assert load_imbalance(loads[1]) == pytest.approx(4.0)
    assert 1.0 <= load_imbalance(loads[0]) < 4.0
    assert load_imbalance([0.25] * 4) == pytest.approx(1.0)


def test_a_dense_model_has_no_expert_load():
    model = AttnResLM(ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                  intermediate_size=32))
    assert collect_expert_loads(model, [torch.zeros(1, 4, dtype=torch.long)]) == []


def test_imbalance_is_the_largest_load_over_the_mean():
    assert [load_imbalance(row) for row in ([1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0])] == [1.0, 4.0]
    assert math.isnan(load_imbalance([0.0] * 4))  # a layer without assignments
