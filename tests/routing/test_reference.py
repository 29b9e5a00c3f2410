"""The reference router against method §2, written as a naive loop over sources and tokens."""

import pytest
import torch

from attnres.routing import route_reference
from attnres.methods import Router


def naive_route(query, gain, sources, eps):
    """Per token, per source: k = g * v / rms(v); z = w . k; alpha = softmax(z); out = sum alpha v."""
    b, t, d = sources[0].shape
    out = torch.zeros(b, t, d, dtype=torch.float64)
    weights = torch.zeros(b, t, len(sources), dtype=torch.float64)
    for bi in range(b):
        for ti in range(t):
            scores = []
            for v in sources:
                vec = v[bi, ti].double()
                key = gain.double() * vec / torch.sqrt((vec * vec).mean() + eps)
                scores.append(float(torch.dot(query.double(), key)))
            top = max(scores)
            exps = [pow(2.718281828459045, z - top) for z in scores]
            total = sum(exps)
            for i, v in enumerate(sources):
                weights[bi, ti, i] = exps[i] / total
                out[bi, ti] += weights[bi, ti, i] * v[bi, ti].double()
    return out, weights


def random_inputs(n=4, b=2, t=3, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(d, generator=g, dtype=dtype)
    gain = 1 + 0.5 * torch.randn(d, generator=g, dtype=dtype)
    # Sources of very different scales, as real depth outputs are; keys are scale-free.
    sources = [torch.randn(b, t, d, generator=g, dtype=dtype) * (i + 1) ** 2 for i in range(n)]
    return query, gain, sources


@pytest.mark.parametrize("n", [1, 2, 5])
def test_matches_naive_loop(n):
    query, gain, sources = random_inputs(n=n)
    mixed, weights = route_reference(query, gain, sources, eps=1e-6)
    ref_mixed, ref_weights = naive_route(query, gain, sources, eps=1e-6)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mixed, ref_mixed, rtol=1e-12, atol=1e-12)


def test_weights_sum_to_one_and_are_positive():
    query, gain, sources = random_inputs(n=6, dtype=torch.float32)
    _, weights = route_reference(query * 10, gain, sources, eps=1e-6)
    assert weights.shape == (2, 3, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    assert torch.all(weights > 0)


def test_zero_query_gives_uniform_weights_and_the_mean():
    _, gain, sources = random_inputs(n=4)
    mixed, weights = route_reference(torch.zeros(8, dtype=torch.float64), gain, sources, eps=1e-6)
    torch.testing.assert_close(weights, torch.full((2, 3, 4), 0.25, dtype=torch.float64))
    torch.testing.assert_close(mixed, sum(sources) / 4)


def test_no_scale_and_no_temperature():
    """z_i = w . k_i exactly: doubling w squares the ratio of two weights (no 1/sqrt(D))."""
    query, gain, sources = random_inputs(n=2)
    _, w1 = route_reference(query, gain, sources, eps=1e-6)
    _, w2 = route_reference(2 * query, gain, sources, eps=1e-6)
    torch.testing.assert_close(w2[..., 0] / w2[..., 1], (w1[..., 0] / w1[..., 1]) ** 2)


def test_gradcheck_over_query_gain_and_sources():
    query, gain, sources = random_inputs(n=3, b=1, t=2, d=5)
    inputs = [x.clone().requires_grad_() for x in (query, gain, *sources)]

    def f(q, g, *srcs):
        mixed, weights = route_reference(q, g, list(srcs), eps=1e-6)
        return mixed, weights

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


def test_fp32_statistics_under_bf16_autocast():
    query, gain, sources = random_inputs(n=3, dtype=torch.float32)
    sources = [s.bfloat16() for s in sources]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, weights = route_reference(query * 3, gain, sources, eps=1e-6)
    assert weights.dtype == torch.float32 and mixed.dtype == torch.bfloat16
    ref_mixed, ref_weights = naive_route(query * 3, gain, sources, eps=1e-6)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mixed.double(), ref_mixed, rtol=1e-2, atol=1e-2)


def test_mixed_dtypes_promote():
    query, gain, sources = random_inputs(n=2, dtype=torch.float32)
    mixed, _ = route_reference(query, gain, [sources[0], sources[1].bfloat16()], eps=1e-6)
    assert mixed.dtype == torch.float32


def test_no_sources_is_an_error():
    with pytest.raises(ValueError, match="at least one source"):
        route_reference(torch.zeros(4), torch.ones(4), [], eps=1e-6)


def test_router_module_parameters_and_init():
    router = Router(8, eps=1e-6)
    assert router.query.shape == (8,) and torch.all(router.query == 0)
    assert router.key_norm.weight.shape == (8,) and torch.all(router.key_norm.weight == 1)
    assert router.gate is None
    _, _, sources = random_inputs(n=3, dtype=torch.float32)
    mixed, weights = router(sources)
    torch.testing.assert_close(weights, torch.full((2, 3, 3), 1 / 3))
    torch.testing.assert_close(mixed, sum(sources) / 3)


def test_gated_router_scales_by_gate_starting_at_zero():
    router = Router(8, eps=1e-6, gated=True)
    _, _, sources = random_inputs(n=2, dtype=torch.float32)
    mixed, _ = router(sources)
    assert torch.all(mixed == 0)
    with torch.no_grad():
        router.gate.fill_(0.5)
    mixed, _ = router(sources)
    torch.testing.assert_close(mixed, 0.5 * (sources[0] + sources[1]) / 2)
