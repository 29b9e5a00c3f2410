"""A decoder with Kimi Linear's options (mixture of experts, latent attention, Kimi Delta Attention):
the layer pattern builds the right token mixers, every residual variant trains on it, the
function-preserving ones start as its standard model, decoding with a cache (padded or not, growing
or static) equals the full forward, and bad options fail at construction by name.
(Exactness against transformers' KimiLinearForCausalLM: tests/hf/test_kimi_linear.py.)"""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.generation import FastGenerator
from attnres.model import ConfigError, KVCache
from attnres.model.model_config import default_layer_types
from attnres.model.flops import flops_per_token
from attnres.model.kda import KimiDeltaAttention
from attnres.model.mla import LatentAttention
from attnres.residual import VARIANTS
from tests.helpers import options_of, train_losses

KIMI = dict(vocab_size=64, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=2, intermediate_size=32,
            max_seq_len=64, tie_embeddings=False,
            moe={"num_experts": 4, "experts_per_token": 2, "expert_size": 8, "shared_experts": 1, "dense_layers": 1,
                 "scoring": "sigmoid", "score_bias": True, "routed_scale": 2.0},
            mla={"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6},
            kda={"num_heads": 2, "head_dim": 4, "short_conv_kernel_size": 3},
            layer_types=["linear_attention", "latent_attention", "linear_attention", "latent_attention"])


def config_for(residual: str = "standard", **changes) -> ModelConfig:
    blocks = 2 if VARIANTS[residual].uses_blocks else None
    return ModelConfig(**{**KIMI, **changes}, residual=residual, residual_options=options_of(num_blocks=blocks))


def test_layer_types_choose_the_token_mixers():
    model = AttnResLM(config_for())
    assert [type(layer.self_attn) for layer in model.layers] == [KimiDeltaAttention, LatentAttention] * 2
    assert default_layer_types(8, linear=True) == ("linear_attention",) * 3 + ("full_attention",) + \
        ("linear_attention",) * 3 + ("full_attention",)  # Kimi Linear's checkpoints: layers 4 and 8 full
    assert config_for(layer_types=None).layer_types == ("linear_attention",) * 3 + ("latent_attention",)
    assert config_for(layer_types=None, kda=None).layer_types == ("latent_attention",) * 4  # mla alone: all latent
    assert config_for(layer_types=None, mla=None).layer_types == ("linear_attention",) * 3 + ("full_attention",)


def test_full_attention_layers_of_a_model_with_mla_are_latent_with_a_warning_until_0_4_0():
    with pytest.warns(DeprecationWarning, match=r"ModelConfig\(mla=\.\.\., layer_types=\[\.\.\., 'full_attention', "
                                                r"\.\.\.\]\) for latent attention layers is deprecated since attnres "
                                                r"0\.3\.0 .*; use 'latent_attention'"):
        old = config_for(layer_types=["linear_attention", "full_attention"] * 2)
    assert old == config_for()
    read = ModelConfig.from_dict({**config_for().to_dict(), "layer_types": ["linear_attention", "full_attention"] * 2})
    assert read == config_for()  # a file written by 0.2.0 reads without a warning


# The mixture of experts alone (dense layers of grouped-query attention), and all of Kimi Linear.
OPTIONS = {"moe": dict(mla=None, kda=None, layer_types=None), "kimi": {}}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("residual", list(VARIANTS))
def test_every_variant_trains_on_kimi_linear(residual, options):
    torch.manual_seed(0)
    model = AttnResLM(config_for(residual, **OPTIONS[options]))
    batch = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(1))
    losses = train_losses(model, batch, steps=10)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("residual", ["full_attnres", "block_attnres", "delta_attnres", "denseformer",
                                      "hyper_connections"])
def test_function_preserving_variants_start_as_the_standard_kimi_model(residual, options):
    """The residual scheme does not care what a sub-layer computes: a standard model's weights loaded
    into these variants give its logits at the start (Full, Block and Delta to the norm's eps)."""
    torch.manual_seed(0)
    # Uniform routing divides the stream by up to n sources, which moves RMSNorm by ~eps n^2 / mean(x^2):
    # a tiny eps keeps that far below the tolerance.
    standard = AttnResLM(config_for(norm_eps=1e-12, **OPTIONS[options])).double().eval()
    routed = AttnResLM(config_for(residual, norm_eps=1e-12, **OPTIONS[options])).double().eval()
    loaded = routed.load_state_dict(standard.state_dict(), strict=False)
    assert loaded.unexpected_keys == [] and all(key.startswith("residual.") for key in loaded.missing_keys)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(routed(ids).logits, standard(ids).logits, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("residual", ["standard", "block_attnres", "hyper_connections"])
def test_decoding_with_a_cache_equals_the_full_forward(residual):
    torch.manual_seed(0)
    model = AttnResLM(config_for(residual)).double().eval()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    cache = KVCache()
    with torch.no_grad():
        full = model(ids).logits
        pieces = [model(ids[:, :4], cache=cache).logits, model(ids[:, 4:7], cache=cache).logits]
        pieces += [model(ids[:, t:t + 1], cache=cache).logits for t in range(7, 10)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)
    assert cache.get_seq_length() == 10 and sorted(cache.keys) == [1, 3] and sorted(cache.linear) == [0, 2]


def test_a_left_padded_row_decodes_as_the_row_alone():
    torch.manual_seed(0)
    model = AttnResLM(config_for("block_attnres")).double().eval()
    row = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(4))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    batch = torch.cat([padded, torch.randint(1, 64, (1, 9), generator=torch.Generator().manual_seed(5))])
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    with torch.no_grad():
        alone = model(row).logits[0]
        together = model(batch, attention_mask=mask).logits[0, 3:]
    torch.testing.assert_close(together, alone, rtol=1e-10, atol=1e-10)


def test_fast_generation_decodes_eagerly_and_greedily_as_the_model():
    torch.manual_seed(0)
    model = AttnResLM(config_for("block_attnres", moe=None)).eval()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(6))
    result = FastGenerator(model, compile="auto").generate(ids, 6)
    assert result.compile_choice == "eager: the step of a model with Kimi Linear's latent or delta attention " \
                                    "is not compiled yet"
    tokens = ids
    with torch.no_grad():
        for _ in range(6):
            tokens = torch.cat([tokens, model(tokens).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(result.sequences, tokens)
    with pytest.raises(Exception, match="latent or delta attention is not compiled yet"):
        FastGenerator(model, compile=True).generate(ids, 2)


def test_flops_count_latent_and_delta_attention():
    flops = flops_per_token(config_for(), seq_len=32)
    dense = flops_per_token(config_for(mla=None, kda=None, layer_types=None), seq_len=32)
    mla, kda = KIMI["mla"], KIMI["kda"]
    heads, t = KIMI["num_heads"], 32
    # two MLA layers: QK^T over qk_head_dim, AV over v_head_dim; two KDA layers: 6 H dk dv per token for
    # the state and 2 K per channel of the q, k, v convolutions
    width = kda["num_heads"] * kda["head_dim"]
    expected = 2 * 2 * t * heads * (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] + mla["v_head_dim"]) \
        + 2 * (6 * kda["num_heads"] * kda["head_dim"] ** 2 + 2 * kda["short_conv_kernel_size"] * 3 * width)
    assert flops.attention == expected and flops.attention != dense.attention


@pytest.mark.parametrize("changes, message", [
    (dict(layer_types=["linear_attention"] * 4), "needs at least one layer that caches keys and values"),
    (dict(layer_types=["full_attention"] * 3), r"layer_types must be None or a list of num_layers=4"),
    (dict(layer_types=["linear_attention", "latent_attention"] * 2, kda=None), "ModelConfig.kda is None"),
    (dict(layer_types=["linear_attention", "latent_attention"] * 2, mla=None), "ModelConfig.mla is None"),
    (dict(kda={"num_heads": 2, "head_dim": 0}), r"ModelConfig.kda: KDAConfig.head_dim must be a positive integer"),
    (dict(mla={"kv_lora_rank": 8}), r"ModelConfig.mla: .*qk_nope_head_dim"),
])
def test_bad_kimi_options_fail_at_construction_naming_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        config_for(**changes)
