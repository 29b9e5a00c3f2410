"""A decoder with a mixture-of-experts feed-forward (ModelConfig.moe): the first dense layers stay
dense, its FLOPs count active parameters, it saves, loads and decodes. (Every variant training on it and
the function-preserving ones starting as its standard model: tests/model/test_kimi_decoder.py.)"""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.generation import FastGenerator
from attnres.model import ConfigError
from attnres.model.flops import flops_per_token
from attnres.model.mlp import MLP
from attnres.model.moe import MixtureOfExperts
from attnres.residual import VARIANTS
from tests.helpers import options_of

MOE = {"num_experts": 8, "experts_per_token": 2, "expert_size": 8, "shared_experts": 1, "dense_layers": 1,
       "scoring": "sigmoid", "score_bias": True, "num_groups": 2, "groups_per_token": 1, "routed_scale": 2.0}
SHAPE = dict(vocab_size=64, hidden_size=16, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=32,
             max_seq_len=64, tie_embeddings=False)


def config_for(residual: str = "standard", **changes) -> ModelConfig:
    blocks = 2 if VARIANTS[residual].uses_blocks else None
    return ModelConfig(**{**SHAPE, "moe": MOE, **changes}, residual=residual,
                       residual_options=options_of(num_blocks=blocks))


def test_the_first_layers_stay_dense_and_the_rest_are_experts():
    model = AttnResLM(config_for())
    assert [type(layer.mlp) for layer in model.layers] == [MLP, MixtureOfExperts, MixtureOfExperts, MixtureOfExperts]
    assert float(model.layers[1].mlp.experts.gate_up_proj.detach().std()) == pytest.approx(0.02, rel=0.2)  # initialised
    assert not model.layers[1].mlp.gate.score_bias.any()


def test_flops_count_the_active_experts_only():
    config = config_for()
    dense = config_for(moe=None)
    d, f, e, k = 16, 8, 8, 2
    attention = 2 * (2 * d * 16 + 2 * d * 8)  # q, o (4 heads of 4); k, v (2 heads of 4)
    moe_layer = attention + 2 * d * e + k * 2 * 3 * d * f + 2 * 3 * d * f  # router, 2 experts, 1 shared
    dense_layer = attention + 2 * 3 * d * 32
    assert flops_per_token(config, 16).linear == dense_layer + 3 * moe_layer
    assert flops_per_token(dense, 16).linear == 4 * dense_layer


def test_a_bad_moe_field_fails_at_construction_naming_it():
    with pytest.raises(ConfigError, match=r"ModelConfig\.moe: MoEConfig\.experts_per_token"):
        config_for(moe={**MOE, "experts_per_token": 9})
    with pytest.raises(ConfigError, match=r"ModelConfig\.moe: MoEConfig: unknown field\(s\) \['top_k'\]"):
        config_for(moe={**MOE, "top_k": 2})
    with pytest.raises(ConfigError, match=r"dense_layers must be from 0 to num_layers=4"):
        config_for(moe={**MOE, "dense_layers": 5})
    assert ModelConfig(**config_for().to_dict()) == config_for()  # the dict form round-trips


def test_it_saves_loads_and_decodes(tmp_path):
    transformers = pytest.importorskip("transformers")
    import attnres.hf  # noqa: F401  (registers the Auto classes)
    from attnres.hf import save_hf

    torch.manual_seed(0)
    model = AttnResLM(config_for("block_attnres")).eval()
    save_hf(model, tmp_path / "moe")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
        plain = loaded.generate(ids, max_new_tokens=6, do_sample=False)
    fast = loaded.generate_fast(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(fast.sequences, plain)
    assert fast.compile_choice == "eager: the step of a mixture-of-experts model is not compiled yet"
    with pytest.raises(Exception, match="mixture-of-experts model is not compiled yet"):
        FastGenerator(model, compile=True).generate(ids, 4)
