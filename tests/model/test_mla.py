"""Multi-head latent attention (attnres.model.mla) equals transformers' `KimiLinearAttention` in float64,
outputs and gradients, at several shapes; decoding with a cache (expanded and absorbed paths, attnres's
KVCache and StaticKVCache, transformers' DynamicCache) equals the full forward; the cache holds only
the latent; a padded row equals the row alone; bad options fail naming the field."""

import pytest
import torch
from torch.func import functional_call

from attnres.common.errors import InputError
from attnres.model import KVCache, StaticKVCache, init_module
from attnres.model.attention_config import MLAConfig
from attnres.model.layers import padded_causal_mask
from attnres.model.mla import LatentAttention
from tests.helpers import kimi_linear_in_float64

transformers = pytest.importorskip("transformers")
from transformers.models.kimi_linear import modeling_kimi_linear  # noqa: E402

SHAPES = [  # (hidden, heads, kv_lora_rank, qk_nope, qk_rope, v, q_lora_rank, attention_bias)
    (16, 2, 8, 6, 4, 5, None, False),
    (24, 4, 12, 8, 2, 8, 10, True),
    (12, 3, 6, 4, 3, 9, 5, False),  # v_head_dim > qk_head_dim: values not padded for SDPA
    (20, 1, 10, 5, 5, 4, None, True),
]
TOL = {"rtol": 1e-12, "atol": 1e-12}


def mla_options(kv_lora, nope, rope, v, q_lora):
    return MLAConfig(kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
                     q_lora_rank=q_lora)


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random, norm gains and biases included."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.5)


def random_mla(hidden=16, heads=2, kv_lora=8, nope=6, rope=4, v=5, q_lora=6, bias=True, seed=0):
    module = LatentAttention(hidden, heads, mla_options(kv_lora, nope, rope, v, q_lora), bias).double()
    randomise(module, seed)
    return module


def reference_pair(shape, seed=0):
    """transformers' KimiLinearAttention with random weights, and ours loaded from its state dict."""
    hidden, heads, kv_lora, nope, rope, v, q_lora, bias = shape
    config = transformers.KimiLinearConfig(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads, kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, q_lora_rank=q_lora, attention_bias=bias,
        attn_implementation="eager")
    reference = modeling_kimi_linear.KimiLinearAttention(config, layer_idx=0).double()
    randomise(reference, seed)
    ours = LatentAttention(hidden, heads, mla_options(kv_lora, nope, rope, v, q_lora), bias).double()
    ours.load_state_dict(reference.state_dict())  # strict: the names are transformers'
    return ours, reference


def additive_causal_mask(batch, length):
    """The (B, 1, T, T) float mask transformers' eager attention adds to its scores."""
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    mask = torch.zeros(length, length, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    return mask.expand(batch, 1, length, length)


def random_input(*shape, seed=1):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_equals_kimi_linear_attention_in_float64(shape, monkeypatch):
    kimi_linear_in_float64(monkeypatch)
    ours, reference = reference_pair(shape)
    x = random_input(3, 7, shape[0])
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours = ours(x_ours)
    y_ref, _ = reference(x_ref, attention_mask=additive_causal_mask(3, 7))
    torch.testing.assert_close(y_ours, y_ref, **TOL)
    weight = torch.randn_like(y_ref)  # a loss that reaches every output value differently
    (y_ours * weight).sum().backward()
    (y_ref * weight).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, **TOL)
    reference_parameters = dict(reference.named_parameters())
    assert set(reference_parameters) == {name for name, _ in ours.named_parameters()}
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, reference_parameters[name].grad, **TOL, msg=name)


def test_the_float64_reference_needs_its_float32_patched(monkeypatch):
    """Without the patch the reference rounds its norms to float32 (a difference ~1e-7); with it the
    comparison above is exact to rounding (~1e-15), so its 1e-12 tolerance really tests something."""
    ours, reference = reference_pair(SHAPES[1])
    x = random_input(3, 7, SHAPES[1][0])
    with torch.no_grad():
        y = ours(x)
        rounded = (reference(x, attention_mask=additive_causal_mask(3, 7))[0] - y).abs().max().item()
        kimi_linear_in_float64(monkeypatch)
        exact = (reference(x, attention_mask=additive_causal_mask(3, 7))[0] - y).abs().max().item()
    assert rounded > 1e-10 and exact < 1e-13, (rounded, exact)


def new_cache(kind):
    return KVCache() if kind == "kvcache" else transformers.DynamicCache()


@pytest.mark.parametrize("kind", ["kvcache", "dynamic"])
@pytest.mark.parametrize("q_lora", [None, 6])
def test_decoding_with_a_cache_equals_the_full_forward(kind, q_lora):
    mla = random_mla(q_lora=q_lora)
    x = random_input(2, 9, 16)
    with torch.no_grad():
        full = mla(x)
        cache = new_cache(kind)  # one token at a time: the absorbed (latent-space) path
        steps = torch.cat([mla(x[:, i:i + 1], cache=cache) for i in range(9)], dim=1)
        cache = new_cache(kind)  # a prompt, then continuations of several tokens and of one
        chunks = torch.cat([mla(x[:, a:b], cache=cache) for a, b in ((0, 3), (3, 7), (7, 8), (8, 9))], dim=1)
    torch.testing.assert_close(steps, full, **TOL)
    torch.testing.assert_close(chunks, full, **TOL)


def test_decoding_with_a_static_cache_and_its_mask_equals_the_full_forward():
    """As compiled generation drives it: the prompt through `update`, then each token written at a
    column, attending over the whole zero-filled buffer with a (B, 1, 1, capacity) mask."""
    mla = random_mla()
    x = random_input(2, 8, 16)
    cache = StaticKVCache(max_len=12)
    with torch.no_grad():
        outputs = [mla(x[:, :5], cache=cache)]
        for i in range(5, 8):
            mask = (torch.arange(12) <= i).expand(2, 1, 1, 12)
            outputs.append(mla(x[:, i:i + 1], cache=cache.at(torch.tensor([i])), mask=mask))
        torch.testing.assert_close(torch.cat(outputs, dim=1), mla(x), **TOL)


def test_the_cache_holds_only_the_latent_and_the_shared_key():
    mla = random_mla(hidden=16, heads=2, kv_lora=8, nope=6, rope=4, v=5)
    cache = KVCache(max_len=10)
    with torch.no_grad():
        mla(random_input(3, 6, 16), cache=cache, layer_idx=0)
        mla(random_input(3, 1, 16), cache=cache, layer_idx=0)
    assert len(cache.keys) == len(cache.values) == 1 and cache.get_seq_length(0) == 7
    assert tuple(cache.keys[0].shape) == (3, 1, 10, 8)  # the normed latent (B, 1, capacity, kv_lora_rank)
    assert tuple(cache.values[0].shape) == (3, 1, 10, 4)  # the shared key part (B, 1, capacity, qk_rope_head_dim)


@pytest.mark.parametrize("q_lora", [None, 6])
def test_a_padded_row_equals_the_row_alone(q_lora):
    """Left-padded prefill with padded_causal_mask, then two decoded tokens (the absorbed path under a
    mask): every real position equals its row run alone."""
    mla = random_mla(q_lora=q_lora)
    lengths, width = (7, 4, 2), 7
    x = random_input(3, width + 2, 16)  # pads hold random values: the mask alone must hide them
    attention_mask = torch.zeros(3, width + 2, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention_mask[row, width - n:] = 1
    cache = KVCache()
    with torch.no_grad():
        out = [mla(x[:, :width], cache=cache, mask=padded_causal_mask(attention_mask[:, :width], width))]
        for i in (width, width + 1):
            out.append(mla(x[:, i:i + 1], cache=cache, mask=padded_causal_mask(attention_mask[:, :i + 1], 1)))
        out = torch.cat(out, dim=1)
        for row, n in enumerate(lengths):
            real = slice(width - n, width + 2)
            torch.testing.assert_close(out[row, real], mla(x[row:row + 1, real])[0], **TOL)


def test_gradcheck_prefill_and_a_decoded_step():
    mla = random_mla(hidden=6, heads=2, kv_lora=3, nope=2, rope=2, v=3, q_lora=3, bias=True)
    names = [name for name, _ in mla.named_parameters()]
    parameters = [p.detach().clone().requires_grad_() for p in mla.parameters()]

    def prefill_then_step(prompt, token, *values):
        cache, weights = KVCache(), dict(zip(names, values))
        first = functional_call(mla, weights, (prompt,), {"cache": cache})
        return first, functional_call(mla, weights, (token,), {"cache": cache})

    prompt = random_input(2, 3, 6, seed=2).requires_grad_()
    token = random_input(2, 1, 6, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(prefill_then_step, (prompt, token, *parameters))


def test_init_module_reaches_every_parameter():
    mla = LatentAttention(16, 2, mla_options(8, 6, 4, 5, 6), attention_bias=True)
    with torch.no_grad():
        for parameter in mla.parameters():
            parameter.fill_(float("nan"))
    for module in mla.modules():
        init_module(module, std=0.02)
    assert all(torch.isfinite(p).all() for p in mla.parameters())


def test_rope_is_ignored():
    mla = random_mla()
    x = random_input(2, 4, 16)
    rope = (torch.ones(4, 10, dtype=torch.float64), torch.ones(4, 10, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(mla(x, rope), mla(x), rtol=0, atol=0)


@pytest.mark.parametrize("build, named", [
    (lambda: MLAConfig(kv_lora_rank=0, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4),
     "MLAConfig.kv_lora_rank"),
    (lambda: MLAConfig(kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4, q_lora_rank=0),
     "MLAConfig.q_lora_rank"),
    (lambda: LatentAttention(16, 0, mla_options(8, 6, 4, 5, None)), "LatentAttention num_heads"),
    (lambda: LatentAttention(16, 2, {"kv_lora_rank": 8, "rank": 2}), "unknown field"),
])
def test_bad_options_fail_naming_the_field(build, named):
    with pytest.raises(InputError, match=named):
        build()
