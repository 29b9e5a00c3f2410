"""The memory-lean routing ops: the reference's function, exact gradients, only per-token scalars saved."""

import pytest
import torch

from attnres.routing import inv_rms, route_reference, route_sources
from attnres.methods import Router

EPS = 1e-6


def lean(queries, gains, sources):
    """S routers (queries, gains (S, D)) over `sources` through the lean ops."""
    return route_sources(queries * gains, list(sources), [inv_rms(v, EPS) for v in sources])


def reference(queries, gains, sources):
    outs = [route_reference(q, g, list(sources), EPS) for q, g in zip(queries, gains)]
    return torch.stack([mixed for mixed, _ in outs]), torch.stack([weights for _, weights in outs])


def inputs(num_queries, num_sources, dtype, shape=(2, 5, 12), seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = shape[-1]
    queries = torch.randn(num_queries, width, generator=generator, dtype=torch.float64).to(dtype)
    gains = (1 + 0.3 * torch.randn(num_queries, width, generator=generator, dtype=torch.float64)).to(dtype)
    sources = [(torch.randn(shape, generator=generator, dtype=torch.float64) * (i + 1)).to(dtype)
               for i in range(num_sources)]
    return [t.requires_grad_() for t in (queries, gains, *sources)]


@pytest.mark.parametrize("num_queries", [1, 3])
@pytest.mark.parametrize("num_sources", [1, 2, 5])
def test_forward_equals_reference_fp32(num_queries, num_sources):
    queries, gains, *sources = inputs(num_queries, num_sources, torch.float32)
    mixed, lse, weights = lean(queries, gains, sources)
    ref_mixed, ref_weights = reference(queries, gains, sources)
    torch.testing.assert_close(mixed, ref_mixed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
    assert lse.shape == weights.shape[:-1] and lse.dtype == torch.float32


@pytest.mark.parametrize("num_queries, num_sources", [(1, 1), (1, 4), (3, 3)])
def test_gradcheck_float64_every_output(num_queries, num_sources):
    """Exact gradients of mixed, lse and weights w.r.t. queries, gains and sources (float64)."""
    args = inputs(num_queries, num_sources, torch.float64, shape=(2, 3, 6))
    assert torch.autograd.gradcheck(lambda q, g, *v: lean(q, g, v), args)


def test_inv_rms_gradcheck_and_value():
    source = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    expected = torch.rsqrt(source.pow(2).mean(-1) + EPS)
    torch.testing.assert_close(inv_rms(source, EPS), expected)
    assert torch.autograd.gradcheck(lambda v: inv_rms(v, EPS), (source,))


def test_bf16_sources_mixed_with_fp32():
    """bf16 deltas next to an fp32 embedding (autocast's dtypes): fp32 statistics, fp32 output."""
    queries, gains, *sources = inputs(2, 3, torch.float32)
    sources = [sources[0]] + [v.detach().bfloat16().requires_grad_() for v in sources[1:]]
    mixed, _, weights = lean(queries, gains, sources)
    ref_mixed, ref_weights = reference(queries, gains, sources)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mixed, ref_mixed, rtol=1e-4, atol=1e-4)
    mixed.sum().backward()
    assert all(v.grad.dtype == torch.bfloat16 for v in sources[1:])


def test_autocast_does_not_lower_the_logits():
    queries, gains, *sources = inputs(1, 4, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, weights = lean(queries, gains, sources)
    _, ref_weights = reference(queries, gains, sources)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


def test_saves_only_references_and_per_token_scalars():
    """method §5: no stacked copy of the sources and no normalised keys kept for backward."""
    queries, gains, *sources = inputs(2, 4, torch.float32, shape=(2, 16, 32))
    inv = [inv_rms(v, EPS) for v in sources]
    allowed = {t.untyped_storage().data_ptr() for t in (*sources, *inv)}
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, _, weights = route_sources(queries * gains, sources, inv)
    per_token = weights.numel()  # S * B * T * n scalars
    for tensor in saved:
        assert tensor.untyped_storage().data_ptr() in allowed or tensor.numel() <= per_token, tensor.shape
    new_bytes = sum(t.untyped_storage().nbytes() for t in saved
                    if t.untyped_storage().data_ptr() not in allowed)
    assert new_bytes < sum(v.untyped_storage().nbytes() for v in sources) / 4


def test_router_module_paths_agree_including_gate():
    torch.manual_seed(0)
    router = Router(12, EPS, gated=True)
    with torch.no_grad():
        router.query.normal_()
        router.key_norm.weight.uniform_(0.5, 1.5)
        router.gate.fill_(0.7)
    sources = [torch.randn(2, 3, 12) for _ in range(3)]
    mixed, weights = router(sources, impl="lean")
    ref_mixed, ref_weights = router(sources, impl="reference")
    torch.testing.assert_close(mixed, ref_mixed)
    torch.testing.assert_close(weights, ref_weights)


def test_unknown_impl_is_refused_by_name():
    with pytest.raises(ValueError, match="routing_impl must be one of"):
        Router(4)([torch.randn(1, 2, 4)], impl="fast")


@pytest.mark.parametrize("rows, expect_matmul", [(1, False), (64, True)])
def test_compiled_decode_rows_take_logits_as_a_fusable_sum(rows, expect_matmul):
    """Compiling without gradients, a few token rows (a decode step) take their logits as a product and
    a sum, which inductor fuses with the softmax (a matrix product stays one extern call per source);
    many rows keep the matrix product. Both are the reference's function."""
    queries, gains, *sources = (t.detach() for t in inputs(3, 4, torch.float32, shape=(1, rows, 16)))
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    with torch.no_grad():
        mixed, _, weights = torch.compile(lean, backend=record, fullgraph=True)(queries, gains, sources)
    targets = {node.target for graph in graphs for node in graph.graph.nodes if node.op == "call_function"}
    assert any(getattr(target, "__name__", "") == "matmul" for target in targets) == expect_matmul, targets
    ref_mixed, ref_weights = reference(queries, gains, sources)
    torch.testing.assert_close(mixed, ref_mixed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
