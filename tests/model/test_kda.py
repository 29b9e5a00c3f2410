"""Kimi Delta Attention (attnres.model.kda): the chunked and recurrent cores agree; the layer equals
transformers' `KimiLinearDeltaAttention` in float64, outputs and gradients, at several shapes, with
and without a cache; decoding from a cache, a left-padded batch and bf16 inputs behave."""

import math

import pytest
import torch

from attnres.model.attention_config import KDAConfig
from attnres.model.kda import KimiDeltaAttention, kda_chunked, kda_recurrent, l2norm
from tests.helpers import kimi_linear_in_float64

transformers = pytest.importorskip("transformers")
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention  # noqa: E402

F64 = torch.float64


class DictCache:
    """The two methods KimiDeltaAttention asks of a cache, over a dict."""

    def __init__(self) -> None:
        self.states = {}

    def linear_state(self, layer_idx):
        return self.states.get(layer_idx)

    def set_linear_state(self, layer_idx, conv_state, recurrent_state):
        self.states[layer_idx] = (conv_state, recurrent_state)


def core_inputs(b, t, h, dk, dv, seed, with_state, dtype=F64, decay_scale=1.0):
    """Random core inputs of realistic form: normalised q (scaled) and k, decays <= 0, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(b, t, h, dk, generator=gen, dtype=dtype)) * dk ** -0.5
    k = l2norm(torch.randn(b, t, h, dk, generator=gen, dtype=dtype))
    v = torch.randn(b, t, h, dv, generator=gen, dtype=dtype)
    g = -torch.rand(b, t, h, dk, generator=gen, dtype=dtype) * decay_scale
    beta = torch.rand(b, t, h, generator=gen, dtype=dtype)
    state = torch.randn(b, h, dk, dv, generator=gen, dtype=dtype) if with_state else None
    return q, k, v, g, beta, state


@pytest.mark.parametrize("b, t, h, dk, dv, chunk, with_state", [
    (2, 37, 3, 8, 6, 16, False),  # T not a multiple of the chunk
    (2, 37, 3, 8, 6, 16, True),
    (1, 5, 2, 4, 4, 64, True),  # T < chunk
    (3, 24, 1, 16, 8, 8, False),  # T a multiple of the chunk
    (2, 19, 2, 6, 10, 1, True),  # one position per chunk
    (2, 33, 2, 5, 3, 32, True),
])
def test_chunked_equals_recurrent_in_float64(b, t, h, dk, dv, chunk, with_state):
    q, k, v, g, beta, state = core_inputs(b, t, h, dk, dv, seed=t + chunk, with_state=with_state)
    out_r, final_r = kda_recurrent(q, k, v, g, beta, state)
    out_c, final_c = kda_chunked(q, k, v, g, beta, state, chunk_size=chunk)
    assert out_c.shape == (b, t, h, dv) and final_c.shape == (b, h, dk, dv)
    torch.testing.assert_close(out_c, out_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final_c, final_r, rtol=1e-12, atol=1e-12)


def test_chunked_stays_finite_under_strong_decay():
    # Up to -40 per step and channel: a 64-position chunk's cumulative decay reaches about -1300, whose
    # exp(-gamma) would overflow even float64; the chunked form only exponentiates differences <= 0.
    q, k, v, g, beta, state = core_inputs(2, 70, 2, 8, 8, seed=1, with_state=True, dtype=torch.float32,
                                          decay_scale=40.0)
    out_r, final_r = kda_recurrent(q, k, v, g, beta, state)
    out_c, final_c = kda_chunked(q, k, v, g, beta, state, chunk_size=64)
    assert torch.isfinite(out_c).all() and torch.isfinite(final_c).all()
    torch.testing.assert_close(out_c, out_r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final_c, final_r, rtol=1e-4, atol=1e-5)


def test_chunked_core_gradcheck():
    q, k, v, g, beta, state = core_inputs(1, 5, 2, 3, 2, seed=7, with_state=True)
    inputs = tuple(x.requires_grad_() for x in (q, k, v, g, beta, state))
    assert torch.autograd.gradcheck(lambda *xs: kda_chunked(*xs, chunk_size=2), inputs)


# ---- the layer against transformers' KimiLinearDeltaAttention ----

@pytest.fixture
def float64_reference(monkeypatch):
    """transformers' PyTorch fallback in float64 (tests.helpers.kimi_linear_in_float64). Measured: without
    it ours and theirs differ by ~1e-6 in outputs and up to ~3e-4 in gradients; with it by ~1e-14 and
    ~1e-12, so the 1e-12 checks below fail unless it takes effect."""
    kimi_linear_in_float64(monkeypatch)


def kimi_config(hidden, heads, head_dim, kernel):
    return transformers.KimiLinearConfig(
        hidden_size=hidden, linear_num_heads=heads, linear_head_dim=head_dim, linear_conv_kernel_dim=kernel,
        num_hidden_layers=1, rms_norm_eps=1e-5)


def randomise(module, seed):
    """Weights of realistic size (projections ~ unit outputs for unit inputs); A_log and dt_bias as
    transformers' _init_weights draws them; gains near one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, dtype=p.dtype).uniform_(1.0, 16.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                log_dt = torch.empty(p.shape, dtype=p.dtype).uniform_(math.log(1e-3), math.log(1e-1), generator=gen)
                dt = log_dt.exp()
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith("o_norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            elif name == "conv1d.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            else:  # a linear weight (out, in)
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * p.shape[1] ** -0.5)


def layer_pair(hidden, heads, head_dim, kernel, seed=0):
    """transformers' layer (float64, random) and ours with its state dict, loaded strictly."""
    reference = KimiLinearDeltaAttention(kimi_config(hidden, heads, head_dim, kernel), layer_idx=0).double()
    randomise(reference, seed)
    ours = KimiDeltaAttention(hidden, KDAConfig(num_heads=heads, head_dim=head_dim, short_conv_kernel_size=kernel),
                              norm_eps=1e-5).double()
    ours.load_state_dict(reference.state_dict())  # strict: every name and shape matches
    return ours, reference


LAYER_SHAPES = [  # (hidden, heads, head_dim, conv kernel, batch, T)
    (16, 2, 8, 4, 2, 37),
    (24, 3, 4, 2, 3, 70),  # past the reference's 64-position chunk
    (12, 1, 16, 3, 2, 9),
    (8, 2, 6, 1, 1, 5),  # no convolution context at all
]


@pytest.mark.parametrize("hidden, heads, head_dim, kernel, b, t", LAYER_SHAPES)
def test_layer_equals_transformers_in_float64(float64_reference, hidden, heads, head_dim, kernel, b, t):
    ours, reference = layer_pair(hidden, heads, head_dim, kernel, seed=t)
    x = torch.randn(b, t, hidden, dtype=F64, generator=torch.Generator().manual_seed(1))
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x_ours), reference(x_ref)
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-12, atol=1e-12)
    weight = torch.randn_like(y_ref)  # a loss that weighs every output differently
    (y_ours * weight).sum().backward()
    (y_ref * weight).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    theirs = dict(reference.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs[name].grad, rtol=1e-12, atol=1e-12, msg=name)


def test_cached_prefill_and_decode_equal_transformers_with_its_cache(float64_reference):
    hidden, heads, head_dim, kernel = 16, 2, 8, 4
    ours, reference = layer_pair(hidden, heads, head_dim, kernel, seed=3)
    x = torch.randn(2, 12, hidden, dtype=F64, generator=torch.Generator().manual_seed(2))
    mine, theirs = DictCache(), transformers.DynamicCache(config=kimi_config(hidden, heads, head_dim, kernel))
    with torch.no_grad():
        for start, stop in [(0, 6), (6, 7), (7, 8), (8, 11), (11, 12)]:  # prefill, decode, continue, decode
            y_ours = ours(x[:, start:stop], cache=mine)
            y_ref = reference(x[:, start:stop], cache=theirs)
            torch.testing.assert_close(y_ours, y_ref, rtol=1e-12, atol=1e-12)
    conv, recurrent = mine.linear_state(0)
    torch.testing.assert_close(recurrent, theirs.get_recurrent_state(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(conv, theirs.get_conv_state(0)[..., 1:], rtol=0, atol=0)  # they keep K columns


# ---- caching, padding, precision of our layer alone ----

def our_layer(hidden=16, heads=2, head_dim=8, kernel=4, dtype=F64, seed=0):
    layer = KimiDeltaAttention(hidden, KDAConfig(num_heads=heads, head_dim=head_dim, short_conv_kernel_size=kernel),
                               norm_eps=1e-5).to(dtype)
    randomise(layer, seed)
    return layer


@pytest.mark.parametrize("pieces", [[1] * 10, [4, 1, 1, 3, 1], [2, 5, 3]])
def test_decoding_from_a_cache_equals_the_full_forward(pieces):
    layer = our_layer()
    layer.chunk_size = 4
    x = torch.randn(2, sum(pieces), 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = layer(x)
        cache, outs, start = DictCache(), [], 0
        for size in pieces:
            outs.append(layer(x[:, start:start + size], cache=cache))
            start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-12, atol=1e-12)
    conv, recurrent = cache.linear_state(0)
    assert conv.shape == (2, 3 * 16, 3) and recurrent.shape == (2, 2, 8, 8)
    with torch.no_grad():  # the conv state: the last 3 conv inputs, the projections of the last 3 tokens
        last = x[:, -3:]
        expected = torch.cat([layer.q_proj(last), layer.k_proj(last), layer.v_proj(last)], -1).transpose(1, 2)
    torch.testing.assert_close(conv, expected, rtol=1e-12, atol=1e-12)


def test_a_left_padded_batch_gives_each_row_alone():
    layer = our_layer(seed=5)
    layer.chunk_size = 4
    lengths, total, extra = [9, 4, 1], 9, 3  # real prompt lengths; then `extra` decoded tokens
    gen = torch.Generator().manual_seed(6)
    rows = [torch.randn(1, n + extra, 16, dtype=F64, generator=gen) for n in lengths]
    batch = torch.randn(len(rows), total + extra, 16, dtype=F64, generator=gen)  # pads hold garbage
    mask = torch.zeros(len(rows), total, dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        batch[i, total - n:] = row[0]
        mask[i, total - n:] = True
    with torch.no_grad():
        cache = DictCache()
        padded = [layer(batch[:, :total], cache=cache, real=mask)]
        padded += [layer(batch[:, total + j:total + j + 1], cache=cache) for j in range(extra)]
        padded = torch.cat(padded, dim=1)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            torch.testing.assert_close(padded[i, total - n:], layer(row)[0], rtol=1e-12, atol=1e-12)


def test_bf16_inputs_give_bf16_outputs_with_fp32_states():
    layer32 = our_layer(dtype=torch.float32, seed=8)
    layer16 = our_layer(dtype=torch.bfloat16, seed=8)
    x = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(9))
    cache = DictCache()
    y16 = layer16(x.bfloat16(), cache=cache)
    step = layer16(x[:, :1].bfloat16(), cache=cache)
    assert y16.dtype == torch.bfloat16 and step.dtype == torch.bfloat16
    assert all(state.dtype == torch.float32 for state in cache.linear_state(0))
    y32 = layer32(x)
    assert torch.isfinite(y16.float()).all()
    assert (y16.float() - y32).abs().max() < 0.05 * y32.abs().max()
    y16.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad.float()).all() for p in layer16.parameters())


def test_chunk_size_is_a_setting_not_state():
    layer = our_layer()
    x = torch.randn(1, 30, 16, dtype=F64)
    with torch.no_grad():
        layer.chunk_size = 7
        a = layer(x)
        layer.chunk_size = 64
        b = layer(x)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not any("chunk" in name for name in layer.state_dict())
