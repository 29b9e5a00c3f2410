"""The decoder against Hugging Face's Qwen3, its output contract, and its call-time errors."""

import numpy as np
import pytest
import torch

from attnres import AttnResLM, ModelConfig
from tests.helpers import activate_routing, options_of

transformers = pytest.importorskip("transformers")

VARIANTS = [
    ("standard", None, None), ("full_attnres", None, None), ("block_attnres", 2, None),
    ("delta_attnres", None, None), ("delta_block", 2, None), ("delta_block", 2, "gate"),
    ("delta_block", 2, "partial"),
]


def small_config(**overrides):
    values = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=48, rope_theta=10000.0, max_seq_len=64)
    return ModelConfig(**{**values, **overrides})


def hf_twin(config: ModelConfig, seed: int = 0):
    """A Hugging Face Qwen3ForCausalLM of the same shape with random weights, and our copy of it."""
    hf_config = transformers.Qwen3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        max_position_embeddings=config.max_seq_len, tie_word_embeddings=config.tie_embeddings,
        attn_implementation="eager")
    torch.manual_seed(seed)
    hf = transformers.Qwen3ForCausalLM(hf_config).eval()
    with torch.no_grad():  # non-trivial norm gains so a misplaced gain shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    ours = AttnResLM(config).eval()
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    ours.load_state_dict(state, strict=True)
    return hf, ours


@pytest.mark.parametrize("tie", [True, False])
def test_standard_matches_hf_qwen3_logits_and_loss(tie):
    config = small_config(tie_embeddings=tie)
    hf, ours = hf_twin(config)
    ids = torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, 4] = -100
    with torch.no_grad():
        expected = hf(input_ids=ids, labels=labels)
        got = ours(ids, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)


def test_tied_embeddings_share_one_tensor():
    model = AttnResLM(small_config(tie_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    model = AttnResLM(small_config(tie_embeddings=False))
    assert model.lm_head.weight.data_ptr() != model.embed_tokens.weight.data_ptr()


def test_loss_is_shifted_next_token_cross_entropy():
    model = AttnResLM(small_config())
    ids = torch.randint(0, 97, (3, 9))
    out = model(ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert model(ids).loss is None


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS)
def test_output_contract(residual, num_blocks, exact):
    config = small_config(residual=residual, residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact))
    model = AttnResLM(config)
    ids = torch.randint(0, 97, (2, 5))
    out = model(ids, return_routing=True)
    assert out.logits.shape == (2, 5, 97)
    n_routers = {"standard": 0, "full_attnres": 5, "block_attnres": 5}.get(residual, 4)
    assert len(model.routers) == n_routers
    if residual == "standard":
        assert out.routing is None
    else:
        assert len(out.routing) == n_routers
        names = model.residual.source_names()
        for weights, router_names in zip(out.routing, names):
            assert weights.shape == (2, 5, len(router_names)) and weights.dtype == torch.float32
            torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    for router in model.routers:
        assert router.query.shape == (32,) and router.key_norm.weight.shape == (32,)
    assert model(ids).routing is None


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS[1:])
def test_standard_state_dict_loads_leaving_only_routing_missing(residual, num_blocks, exact):
    standard = AttnResLM(small_config())
    variant = AttnResLM(small_config(residual=residual,
                                     residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact)))
    result = variant.load_state_dict(standard.state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(k.startswith("residual.routers.") for k in result.missing_keys)
    routing = {k for k, _ in variant.named_parameters() if k.startswith("residual.routers.")}
    assert set(result.missing_keys) == routing


def test_call_time_errors():
    model = AttnResLM(small_config())
    with pytest.raises(ValueError, match=r"token ids in \[0, vocab_size=97\), got values from 0 to 97"):
        model(torch.tensor([[0, 97]]))
    with pytest.raises(ValueError, match=r"token ids in \[0, vocab_size=97\), got values from -1 to 3"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"seq_len 65 after 0 cached positions, longer than the configured maximum ModelConfig.max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids must be token ids of dtype torch.int64 or torch.int32, got "
                                         r"torch.float32; convert them with .long\(\)"):
        model(torch.zeros(1, 5))
    for ids in ([[1, 2, 3]], np.array([[1, 2, 3]])):
        with pytest.raises(ValueError, match=r"input_ids must be a torch tensor of shape \(batch, seq_len\) and "
                                             r"dtype torch.long, got a (list|ndarray)"):
            model(ids)
    with pytest.raises(ValueError, match=r"input_ids must be token ids of dtype torch.int64 or torch.int32, got "
                                         r"torch.int8"):
        model(torch.zeros(1, 5, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"labels must be token ids of dtype torch.int64, got torch.float32"):
        model(torch.zeros(1, 5, dtype=torch.long), labels=torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"labels must have shape \(1, 5\)"):
        model(torch.zeros(1, 5, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long))


def test_routing_init_is_zero_query_unit_gain():
    model = AttnResLM(small_config(residual="delta_block", residual_options={"num_blocks": 2, "exact_conversion": "gate"}))
    for router in model.routers:
        assert torch.all(router.query == 0) and torch.all(router.key_norm.weight == 1)
        assert router.gate is not None and float(router.gate.detach()) == 0.0


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS)
def test_kv_cache_decoding_equals_the_full_forward(residual, num_blocks, exact):
    """Prefill 5 tokens, then a chunk of 3, then 4 single tokens: logits equal one full pass."""
    from attnres.model import KVCache

    torch.manual_seed(0)
    model = AttnResLM(small_config(residual=residual,
                                   residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact))).eval()
    activate_routing(model.routers)
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        full = model(ids, return_routing=True)
        cache = KVCache()
        pieces = [model(ids[:, :5], cache=cache), model(ids[:, 5:8], cache=cache)]
        pieces += [model(ids[:, t:t + 1], cache=cache, return_routing=True) for t in range(8, 12)]
    torch.testing.assert_close(torch.cat([p.logits for p in pieces], dim=1), full.logits, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == 12
    for router_weights, last in zip(full.routing or [], pieces[-1].routing or []):
        torch.testing.assert_close(last, router_weights[:, -1:])
    with pytest.raises(ValueError, match="after 12 cached positions"):
        model(torch.zeros(2, 53, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_standard_matches_hf_llama_and_qwen2(family):
    """qk_norm=False is Llama's attention; attention_bias=True adds Qwen2's q/k/v biases."""
    config = small_config(qk_norm=False, attention_bias=family == "qwen2", tie_embeddings=False)
    common = dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                  intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
                  num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                  rms_norm_eps=config.norm_eps, max_position_embeddings=config.max_seq_len,
                  rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
                  tie_word_embeddings=False, attn_implementation="eager")
    if family == "llama":
        hf_config = transformers.LlamaConfig(head_dim=config.head_dim, **common)
        config = small_config(qk_norm=False, tie_embeddings=False)
        hf_class = transformers.LlamaForCausalLM
    else:
        config = small_config(qk_norm=False, attention_bias=True, tie_embeddings=False, head_dim=8)
        hf_config = transformers.Qwen2Config(**common)
        hf_class = transformers.Qwen2ForCausalLM
    torch.manual_seed(0)
    hf = hf_class(hf_config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    ours = AttnResLM(config).eval()
    ours.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()}, strict=True)
    ids = torch.randint(0, config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
