"""DenseFormer's depth-weighted average (attnres.methods.DepthWeightedAverage), method §7."""

import pytest
import torch

from attnres.methods import DepthWeightedAverage


def sources(n=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 8, generator=g, dtype=dtype) for _ in range(n)]


def test_it_starts_as_the_identity_on_the_last_source_and_computes_a_plain_weighted_sum():
    average = DepthWeightedAverage(8, num_sources=4).double()
    v = sources()
    mixed, weights = average(v)
    assert torch.equal(mixed, v[-1]) and torch.equal(average.alpha, torch.tensor([0.0, 0.0, 0.0, 1.0]).double())
    with torch.no_grad():
        average.alpha.copy_(torch.tensor([0.5, -1.25, 2.0, 0.0]))  # any sign: no softmax, no constraint
    mixed, weights = average(v)
    torch.testing.assert_close(mixed, 0.5 * v[0] - 1.25 * v[1] + 2.0 * v[2], rtol=1e-14, atol=1e-14)
    assert weights.shape == (2, 3, 4) and weights.dtype == torch.float32
    assert torch.equal(weights[1, 2], torch.tensor([0.5, -1.25, 2.0, 0.0]))
    assert average(v, need_weights=False)[1] is None


def test_gradcheck_over_the_sources_and_the_weights_in_float64():
    average = DepthWeightedAverage(8, num_sources=3).double()
    with torch.no_grad():
        average.alpha.copy_(torch.tensor([0.3, -0.7, 1.1]))
    v = [t.requires_grad_() for t in sources(3)]

    def mix(alpha, *tensors):
        return torch.func.functional_call(average, {"alpha": alpha}, (list(tensors),), {"need_weights": False})[0]

    assert torch.autograd.gradcheck(mix, (average.alpha.detach().clone().requires_grad_(), *v))


def test_bf16_sources_stay_bf16_and_fp32_statistics_are_not_needed():
    average = DepthWeightedAverage(8, num_sources=2)
    v = [t.bfloat16() for t in sources(2, torch.float32)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, _ = average(v)
    assert mixed.dtype == torch.bfloat16 and torch.equal(mixed, v[1])


def test_bad_construction_and_calls_are_refused():
    with pytest.raises(ValueError, match="no gate"):
        DepthWeightedAverage(8, gated=True, num_sources=2)
    with pytest.raises(ValueError, match="num_sources must be a positive integer"):
        DepthWeightedAverage(8, num_sources=0)
    with pytest.raises(ValueError, match="built for 2 sources, got 3"):
        DepthWeightedAverage(8, num_sources=2)(sources(3))
