"""Gradient sinks of the fused CPU kernels (fused_cpu.collect_source): a source that many routing
calls read gets the sum of their gradients through one buffer, added by the kernels in the compute
dtype and handed on once, not one gradient per call added by autograd in the source's dtype.
"""

import pytest
import torch

from attnres.routing.fused_cpu import _SINK, collect_source, merge_sources_fused, route_sources_fused
from tests.helpers import needs_fused_cpu

pytestmark = needs_fused_cpu

EPS = 1e-6
SHAPE = (2, 7, 24)  # 14 tokens: several tiles, one partial


def leaves(dtype, num_sources=4, num_queries=3, seed=0):
    """(queries (S, D) in the compute dtype, sources n x SHAPE in `dtype`), leaves requiring grad."""
    generator = torch.Generator().manual_seed(seed)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    queries = torch.randn(num_queries, SHAPE[-1], generator=generator, dtype=torch.float64).to(compute)
    sources = [(torch.randn(SHAPE, generator=generator, dtype=torch.float64) * (i + 1)).to(dtype)
               for i in range(num_sources)]
    return queries.requires_grad_(), [v.requires_grad_() for v in sources]


def weights_like(tensor, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tensor.shape, generator=generator, dtype=torch.float64).to(tensor.dtype)


def loss_of(queries, sources):
    """Phase-1 routes and merges over shared sources, one source listed twice in a call, every output
    used, and a consumer outside routing (the square of source 1)."""
    mixed, lse, _ = route_sources_fused(queries, sources[:3], None, eps=EPS)
    out, total, _, _ = merge_sources_fused(mixed[0], lse[0], queries[0], sources[3:], None, eps=EPS)
    mixed2, lse2, weights2 = route_sources_fused(queries[1:], [sources[0], sources[2], sources[0]], None, eps=EPS)
    out2, *_ = merge_sources_fused(mixed2[1], lse2[1], queries[2], [sources[1], sources[3]], None, eps=EPS)
    parts = (out, total, mixed2, weights2, out2)
    return sum((part * weights_like(part, seed)).sum() for seed, part in enumerate(parts)) + sources[1].square().sum()


def grads_by_backward(queries, sources, collect):
    for leaf in (queries, *sources):
        leaf.grad = None
    loss_of(queries, [collect_source(v) if collect else v for v in sources]).backward()
    return [leaf.grad for leaf in (queries, *sources)]


@pytest.mark.parametrize("dtype, rtol, atol", [(torch.float32, 1e-5, 1e-5), (torch.float64, 1e-12, 1e-12)])
def test_the_same_gradients_as_autograd_summing_them(dtype, rtol, atol):
    queries, sources = leaves(dtype)
    expected = grads_by_backward(queries, sources, collect=False)
    for got, want in zip(grads_by_backward(queries, sources, collect=True), expected):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def test_routing_gradients_go_through_the_sink_not_the_graph():
    """Routing's nodes hand the collected view no gradient: all it receives from the graph is its
    one consumer outside routing's (d square = 2 v); the kernels' gradients reach the leaf through the sink."""
    queries, sources = leaves(torch.float32)
    collected = [collect_source(v) for v in sources]
    seen = []
    collected[1].register_hook(seen.append)
    loss_of(queries, collected).backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], 2 * sources[1].detach(), rtol=0, atol=0)
    assert not torch.allclose(sources[1].grad, seen[0])  # routing's part arrived, through the sink
    assert all(getattr(v, _SINK).numel() == 0 for v in collected)  # each sink is freed once handed on


def test_a_backward_limited_to_some_inputs_gets_them_without_sinks():
    """autograd.grad need not run every collect node, so the kernels then return d sources as usual."""
    queries, sources = leaves(torch.float32)
    expected = grads_by_backward(queries, sources, collect=False)
    collected = [collect_source(v) for v in sources]
    got = torch.autograd.grad(loss_of(queries, collected), [queries, sources[0]])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)
    assert all(getattr(v, _SINK).numel() == 0 for v in collected)


def test_a_retained_graph_gives_the_same_gradients_again():
    queries, sources = leaves(torch.float32)
    loss = loss_of(queries, [collect_source(v) for v in sources])
    loss.backward(retain_graph=True)
    once = [v.grad.clone() for v in sources]
    loss.backward()
    for twice, single in zip((v.grad for v in sources), once):
        torch.testing.assert_close(twice, 2 * single, rtol=1e-6, atol=1e-6)


def test_bf16_sources_get_their_summed_gradient_rounded_once():
    """Eight calls read each bf16 source. Summed in fp32 and rounded once, the gradient is within
    about one rounding of the float64 truth; autograd's sum in bf16 rounds at every call."""
    queries, sources = leaves(torch.bfloat16, num_sources=3, num_queries=2)

    def many_reads(q, vs):
        total = 0
        for k in range(8):
            mixed, lse, _ = route_sources_fused(q * (1 + 0.1 * k), vs, None, eps=EPS)
            total = total + (mixed.float() * weights_like(mixed, k).float()).sum() + lse.sum()
        return total

    truth_q, truth_sources = leaves(torch.float64, num_sources=3, num_queries=2)
    with torch.no_grad():
        for truth, v in zip(truth_sources, sources):
            truth.copy_(v.double())
        truth_q.copy_(queries.double())
    truth = torch.autograd.grad(many_reads(truth_q, truth_sources), truth_sources)
    by_autograd = torch.autograd.grad(many_reads(queries, sources), sources)  # limited backward: no sinks
    many_reads(queries, [collect_source(v) for v in sources]).backward()

    def error(grads):
        return max(((g.double() - t).norm() / t.norm()).item() for g, t in zip(grads, truth))

    one_rounding = error([t.to(torch.bfloat16) for t in truth])
    assert error([v.grad for v in sources]) <= 1.5 * one_rounding
    assert error([v.grad for v in sources]) < error(by_autograd)


def test_collect_is_the_identity_where_no_sink_applies():
    queries, sources = leaves(torch.float32)
    with torch.no_grad():
        assert collect_source(sources[0]) is sources[0]
    plain = sources[0].detach()
    assert collect_source(plain) is plain
    collected = collect_source(sources[0])
    assert collected is not sources[0] and torch.equal(collected, sources[0])
    assert collected.data_ptr() == sources[0].data_ptr()  # a view: no copy
