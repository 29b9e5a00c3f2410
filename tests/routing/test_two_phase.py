"""Two-phase routing: phase 1 over shared sources, then one merge op over the later ones, is the
reference's softmax routing over all of them, with exact gradients, keeping only its output,
per-token scalars and references for backward (method §5)."""

import pytest
import torch

from attnres.routing import RoutedPrefix, inv_rms, merge_remaining, merge_sources, route_group, route_reference
from attnres.routing import two_phase as two_phase_module
from tests.helpers import needs_fused_cpu
from tests.routing.test_lean import EPS, inputs


def two_phase(query, gain, sources, first):
    """One router over `sources`: phase 1 over sources[:first] (a group of one), the rest merged."""
    inv = [inv_rms(v, EPS) for v in sources]
    group = route_group(0, (query * gain)[None], list(sources[:first]), inv[:first], "lean")
    return merge_remaining(group.prefix(0), list(sources), EPS, inv)


@pytest.mark.parametrize("first, later", [(1, 1), (2, 1), (1, 3), (3, 2)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_equals_reference_over_all_sources(first, later, dtype, tol):
    query, gain, *sources = inputs(1, first + later, dtype)
    merged = two_phase(query[0], gain[0], sources, first)
    mixed, weights = route_reference(query[0], gain[0], sources, EPS)
    torch.testing.assert_close(merged.mixed, mixed, rtol=tol, atol=tol)
    torch.testing.assert_close(merged.weights, weights, rtol=tol, atol=tol)
    logits = torch.log(weights) + merged.lse.unsqueeze(-1)  # softmax = exp(logit - lse)
    torch.testing.assert_close(torch.logsumexp(logits, -1), merged.lse, rtol=tol, atol=tol)
    assert merged.num_sources == first + later


@pytest.mark.parametrize("first, later", [(1, 1), (2, 3)])
def test_gradients_through_both_phases_equal_the_reference(first, later):
    """The merge never sees the phase-1 mixture in backward: d lse_1 comes from its own output. The
    chained gradient w.r.t. every source, the query and the gain must still be the reference's."""
    query, gain, *sources = inputs(1, first + later, torch.float64)
    cotangent = torch.randn(sources[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    weight_cotangent = torch.randn((*sources[0].shape[:-1], first + later), dtype=torch.float64)
    merged = two_phase(query[0], gain[0], sources, first)
    grads = []
    for mixed, weights in ((merged.mixed, merged.weights), route_reference(query[0], gain[0], sources, EPS)):
        loss = (mixed * cotangent).sum() + (weights * weight_cotangent).sum()
        grads.append(torch.autograd.grad(loss, [query, gain, *sources]))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("later", [1, 3])
def test_gradcheck_float64_every_output(later):
    """The merge op alone, as a function of independent inputs (prefix mixture, lse, query, later
    sources and their inverse RMS): mixture, total log-sum-exp and weights."""
    generator = torch.Generator().manual_seed(2)
    shape = (2, 3, 6)
    mixed = torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_()
    lse = torch.randn(shape[:-1], dtype=torch.float64, generator=generator).requires_grad_()
    prior = torch.softmax(torch.randn((*shape[:-1], 2), dtype=torch.float64, generator=generator), -1)
    query = torch.randn(shape[-1], dtype=torch.float64, generator=generator).requires_grad_()
    sources = [torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_() for _ in range(later)]
    inv = [(0.5 + torch.rand(shape[:-1], dtype=torch.float64, generator=generator)).requires_grad_()
           for _ in range(later)]

    def merged(mixed, lse, query, *tensors):
        prefix = RoutedPrefix(query, mixed, lse, prior, 2)
        out = merge_sources(prefix, list(tensors[:later]), list(tensors[later:]))
        return out.mixed, out.lse, out.weights

    assert torch.autograd.gradcheck(merged, (mixed, lse, query, *sources, *inv))


def test_bf16_sources_merge_into_an_fp32_prefix_in_fp32():
    query, gain, *sources = inputs(1, 3, torch.float32)
    sources[2] = sources[2].detach().bfloat16().requires_grad_()
    merged = two_phase(query[0], gain[0], sources, 2)
    mixed, weights = route_reference(query[0], gain[0], sources, EPS)
    assert merged.mixed.dtype == torch.float32 and merged.weights.dtype == torch.float32
    torch.testing.assert_close(merged.mixed, mixed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged.weights, weights, rtol=1e-5, atol=1e-5)
    merged.mixed.sum().backward()
    assert sources[2].grad.dtype == torch.bfloat16


def test_autocast_does_not_lower_the_logits():
    query, gain, *sources = inputs(1, 3, torch.float32)
    expected = two_phase(query[0], gain[0], sources, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = two_phase(query[0], gain[0], sources, 1)
    torch.testing.assert_close(got.weights, expected.weights, rtol=0, atol=0)


def test_merge_saves_its_output_per_token_scalars_and_references_only():
    query, gain, *sources = inputs(1, 4, torch.float32, shape=(2, 16, 32))
    inv = [inv_rms(v, EPS) for v in sources]
    prefix = route_group(0, (query * gain), sources[:2], inv[:2], "lean").prefix(0)
    allowed = {t.untyped_storage().data_ptr() for t in (*sources, *inv)}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        merged = merge_sources(prefix, sources[2:], inv[2:])
    full_size = [t for t in saved if t.untyped_storage().data_ptr() not in allowed and t.numel() > 2 * 16 * 2]
    assert len(full_size) == 1 and full_size[0].untyped_storage().data_ptr() == merged.mixed.untyped_storage().data_ptr()
    assert prefix.mixed.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in saved}


def test_a_prefix_with_no_later_sources_is_its_own_copy_under_grad():
    """Router 0 of a group returns its phase-1 result; that must not pin the group's whole (S, B, T, D)."""
    query, gain, *sources = inputs(3, 2, torch.float32)
    inv = [inv_rms(v, EPS) for v in sources]
    prefix = route_group(0, query * gain, sources, inv, "lean").prefix(1)
    routed = merge_remaining(prefix, sources, EPS, inv)
    assert routed.mixed.untyped_storage().data_ptr() != prefix.mixed.untyped_storage().data_ptr()
    torch.testing.assert_close(routed.mixed, prefix.mixed, rtol=0, atol=0)
    with torch.no_grad():
        assert merge_remaining(prefix, sources, EPS, inv) is prefix


def test_merging_nothing_is_refused():
    query, gain, *sources = inputs(1, 1, torch.float32)
    prefix = route_group(0, query * gain, sources, [inv_rms(sources[0], EPS)], "lean").prefix(0)
    with pytest.raises(ValueError, match="at least one later source"):
        merge_sources(prefix, [], [])


@needs_fused_cpu
@pytest.mark.parametrize("cached", ["all", "prefix only"])
@pytest.mark.parametrize("first, later", [(1, 1), (2, 3)])
def test_fused_merge_equals_the_python_merge(first, later, cached, monkeypatch):
    """impl "fused": the C++ merge; with inv cached for the prefix's sources only (the scheme's
    partial), the kernel computes the later ones itself. Same routing and gradients as the PyTorch ops."""
    calls = []
    fused = two_phase_module.merge_sources_fused
    monkeypatch.setattr(two_phase_module, "merge_sources_fused", lambda *a, **k: calls.append(a[4]) or fused(*a, **k))
    query, gain, *sources = inputs(1, first + later, torch.float64)
    cotangent = torch.randn(sources[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    weight_cotangent = torch.randn((*sources[0].shape[:-1], first + later), dtype=torch.float64)
    results = []
    for impl in ("lean", "fused"):
        inv = [inv_rms(v, EPS) for v in sources]
        prefix = route_group(0, (query * gain), sources[:first], inv[:first], "lean").prefix(0)
        merged = merge_remaining(prefix, sources, EPS, inv if cached == "all" else inv[:first], impl=impl)
        loss = (merged.mixed * cotangent).sum() + (merged.weights * weight_cotangent).sum()
        results.append((merged.mixed, merged.lse, merged.weights, *torch.autograd.grad(loss, [query, gain, *sources])))
    for got, expected in zip(*reversed(results), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert len(calls) == 1 and (calls[0] is None) == (cached != "all")  # "lean" stayed on the PyTorch ops


@pytest.mark.parametrize("computed_inv", [False, True])
@pytest.mark.parametrize("later", [1, 3])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 1e-5)])
def test_the_in_graph_merge_is_the_merge(dtype, tol, later, computed_inv):
    """A compiled step without gradients merges with `_merge_in_graph` (one softmax, fewest ops); it
    computes what `_merge_forward` computes: the output in the sources' dtype, the statistics fp32."""
    query, gain, *sources = inputs(1, 1 + later, dtype)
    prefix = route_group(0, (query * gain).detach(), [sources[0].detach()], None, "lean", eps=EPS).prefix(0)
    later_sources = [v.detach() for v in sources[1:]]
    inv = [inv_rms(v, EPS) for v in later_sources]
    with torch.no_grad():
        expected = two_phase_module._merge_forward(prefix.mixed, prefix.lse, prefix.query, later_sources, inv)
        got = two_phase_module._merge_in_graph(prefix.mixed, prefix.lse, prefix.query, later_sources,
                                               None if computed_inv else inv, EPS)
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    out_tol = 1e-2 if dtype == torch.bfloat16 else tol  # bf16: one rounding of the output either way
    torch.testing.assert_close(got[0], expected[0], rtol=out_tol, atol=out_tol)
    torch.testing.assert_close(got[1:], expected[1:], rtol=tol, atol=tol)


@pytest.mark.parametrize("impl", ["lean", pytest.param("fused", marks=needs_fused_cpu)])
def test_a_traced_step_without_gradients_merges_in_the_graph(impl, monkeypatch):
    """Under torch.compile without gradients, merge_sources takes the in-graph merge for "lean" and
    "fused" alike (no extern call per router), and gives the eager merge's routing."""
    query, gain, *sources = inputs(1, 3, torch.float32)
    sources = [v.detach() for v in sources]
    q = (query * gain)[0].detach()
    calls, in_graph = [], two_phase_module._merge_in_graph
    monkeypatch.setattr(two_phase_module, "_merge_in_graph", lambda *args: calls.append(1) or in_graph(*args))

    def routed(*vs):
        prefix = route_group(0, q[None], [vs[0]], None, impl, eps=EPS).prefix(0)
        return merge_sources(prefix, list(vs[1:]), None, need_weights=False, impl=impl, eps=EPS).mixed

    with torch.no_grad():
        eager = routed(*sources)
        assert not calls
        traced = torch.compile(routed, backend="eager", fullgraph=True)(*sources)
    assert calls
    torch.testing.assert_close(traced, eager, rtol=1e-6, atol=1e-6)
