"""The fused CPU routing ops: lean.route_sources's function and gradients, and two-phase routing's
merge (two_phase._merge_forward / _merge_backward), each one C++ pass, only references saved.

The extension is built on first use if tools/setup_env.sh has not built it (about 20 s here);
without it and without a C++ compiler to build it, these tests are skipped
(tests/routing/test_fused_cpu_unavailable.py covers that case).
"""

import itertools

import pytest
import torch

from attnres.routing import inv_rms, resolve_impl, route_fast, route_reference, route_sources
from attnres.routing.fused_cpu import _merge_backward as _fused_merge_backward
from attnres.routing.fused_cpu import (extension_path, fused_available, merge_sources_fused, route_sources_fused,
                                       route_sources_fused_split)
from attnres.routing.lean import _inv_rms_backward
from attnres.routing.two_phase import _merge_backward, _merge_forward
from attnres.routing.two_phase import _MergeSources as _PythonMerge
from tests.helpers import needs_fused_cpu

pytestmark = needs_fused_cpu

EPS = 1e-6


def inputs(num_queries, num_sources, dtype, shape=(2, 5, 12), seed=0):
    """(queries (S, D), sources n x shape, inv n x shape[:-1]), all leaves requiring grad.

    The sources are scaled differently so the routing weights are far from uniform; inv is an
    independent input (its gradient is checked on its own), near the sources' true inverse RMS.
    """
    generator = torch.Generator().manual_seed(seed)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    queries = torch.randn(num_queries, shape[-1], generator=generator, dtype=torch.float64).to(compute)
    sources = [(torch.randn(shape, generator=generator, dtype=torch.float64) * (i + 1)).to(dtype)
               for i in range(num_sources)]
    inv = [inv_rms(v, EPS).detach() * (1 + 0.1 * torch.rand(shape[:-1], generator=generator, dtype=compute))
           for v in sources]
    return [t.requires_grad_() for t in (queries, *sources, *inv)]


def split(args, num_sources):
    return args[0], list(args[1:1 + num_sources]), list(args[1 + num_sources:])


def upstream(outputs, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.dtype) for out in outputs]


def all_grads(fn, args, num_sources, grads_out=None, **kwargs):
    """(outputs, gradients of <outputs, upstream> w.r.t. every input) of fn(queries, sources, inv)."""
    outputs = fn(*split(args, num_sources), **kwargs)
    grads_out = upstream(outputs) if grads_out is None else grads_out
    keep = [(o, g) for o, g in zip(outputs, grads_out) if g is not None]
    grads = torch.autograd.grad([o for o, _ in keep], args, [g for _, g in keep], allow_unused=True)
    return outputs, grads


def assert_all_close(got, expected, rtol, atol):
    for g, e in zip(got, expected, strict=True):
        assert (g is None) == (e is None)
        if g is not None:
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


@pytest.mark.parametrize("num_queries", [1, 3])
@pytest.mark.parametrize("num_sources", [1, 2, 5])
def test_equals_reference_and_lean_fp32(num_queries, num_sources):
    args = inputs(num_queries, num_sources, torch.float32)
    queries, sources, _ = split(args, num_sources)
    outputs, grads = all_grads(route_sources_fused, args, num_sources)
    lean_outputs, lean_grads = all_grads(route_sources, args, num_sources)
    assert_all_close(outputs, lean_outputs, rtol=1e-5, atol=1e-5)
    assert_all_close(grads, lean_grads, rtol=1e-5, atol=1e-5)
    # Against the plain method §2 code, with the sources' true inverse RMS and unit gains.
    true_inv = [inv_rms(v, EPS) for v in sources]
    mixed, _, weights = route_sources_fused(queries, sources, true_inv)
    for s in range(num_queries):
        ref_mixed, ref_weights = route_reference(queries[s], torch.ones_like(queries[s]), sources, EPS)
        torch.testing.assert_close(mixed[s], ref_mixed, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(weights[s], ref_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_queries, num_sources", [(1, 1), (3, 2), (1, 5), (3, 5)])
def test_float64_equals_lean_and_gradcheck_every_output(num_queries, num_sources):
    args = inputs(num_queries, num_sources, torch.float64, shape=(2, 3, 6))
    outputs, grads = all_grads(route_sources_fused, args, num_sources)
    lean_outputs, lean_grads = all_grads(route_sources, args, num_sources)
    assert outputs[0].dtype == outputs[1].dtype == outputs[2].dtype == torch.float64
    assert_all_close(outputs, lean_outputs, rtol=1e-10, atol=1e-10)
    assert_all_close(grads, lean_grads, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda *a: route_sources_fused(*split(a, num_sources)), args)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["float64", "fp32"])
@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
def test_every_register_block_shape_equals_float64_lean(dtype, tol, computed_inv):
    """The kernels work on blocks of up to 4 routers by 4 sources and on chunks of several vectors of a
    row: 6 routers over 7 sources (blocks of 4 and of 2 or 3) at a width of 133 (chunks of several
    vectors, single vectors and a scalar tail, for 8- and 16-lane vectors alike). Each output and
    gradient is within tol of its largest value of lean's float64 result on the same inputs."""
    num_queries, num_sources = 6, 7
    args = inputs(num_queries, num_sources, dtype, shape=(2, 9, 133))
    exact = [t.detach().double().requires_grad_() for t in args]

    def fused(q, v, i):
        return route_sources_fused(q, v, None, eps=EPS) if computed_inv else route_sources_fused(q, v, i)

    def lean(q, v, i):
        return route_sources(q, v, [inv_rms(x, EPS) for x in v] if computed_inv else i)

    truth, truth_grads = all_grads(lean, exact, num_sources)
    got, got_grads = all_grads(fused, args, num_sources, grads_out=[u.to(o.dtype) for u, o in
                                                                   zip(upstream(truth), truth)])
    for g, e in zip((*got, *got_grads), (*truth, *truth_grads), strict=True):
        assert (g is None) == (e is None)
        if g is not None:
            assert g.dtype == dtype
            torch.testing.assert_close(g.double(), e, rtol=0, atol=tol * e.abs().max().item())


def test_gradcheck_through_inv_rms_and_gains():
    """Composed as the routers use it: effective query w * g, inv from inv_rms of the sources."""
    args = inputs(2, 3, torch.float64, shape=(2, 3, 6))[:4]
    gains = (1 + 0.3 * torch.randn(2, 6, dtype=torch.float64)).requires_grad_()

    def routed(q, g, *sources):
        return route_sources_fused(q * g, list(sources), [inv_rms(v, EPS) for v in sources])

    assert torch.autograd.gradcheck(routed, (args[0], gains, *args[1:]))


@pytest.mark.parametrize("present", [(True, False, False), (False, True, False), (False, False, True),
                                     (False, True, True)], ids=["mixed", "lse", "weights", "lse+weights"])
def test_any_subset_of_upstream_gradients(present):
    args = inputs(3, 4, torch.float64, shape=(2, 7, 9))
    outputs = route_sources_fused(*split(args, 4))
    grads_out = [g if keep else None for g, keep in zip(upstream(outputs), present)]
    _, grads = all_grads(route_sources_fused, args, 4, grads_out)
    _, lean_grads = all_grads(route_sources, args, 4, grads_out)
    assert_all_close(grads, lean_grads, rtol=1e-10, atol=1e-10)


def test_uncentered_mixture_gradient():
    """centered=False: d logit_i = alpha_i (<g, v_i> + g_lse) + the softmax backward of g_weights."""
    num_sources = 4
    args = inputs(2, num_sources, torch.float64, shape=(2, 5, 7))
    outputs, grads = all_grads(route_sources_fused, args, num_sources, centered=False)

    def uncentered_reference(queries, sources, inv):
        mixed, lse, weights = route_sources(queries, sources, inv)
        # exp(logit - detached lse) has the value alpha and d/d logit = alpha, with no centring term.
        logits = torch.stack([torch.einsum("sd,btd->sbt", queries, v) * r for v, r in zip(sources, inv)], dim=-1)
        take = torch.exp(logits - lse.detach().unsqueeze(-1))
        return sum(take[..., i, None] * v for i, v in enumerate(sources)), lse, weights

    ref_outputs, ref_grads = all_grads(uncentered_reference, args, num_sources)
    assert_all_close(outputs, ref_outputs, rtol=1e-10, atol=1e-10)
    assert_all_close(grads, ref_grads, rtol=1e-10, atol=1e-10)
    _, centered_grads = all_grads(route_sources_fused, args, num_sources)
    assert not torch.allclose(grads[0], centered_grads[0])  # the flag changes d queries


def test_bf16_sources_mixed_with_fp32():
    """bf16 sub-layer outputs next to an fp32 embedding: read in place, fp32 statistics and output."""
    args = inputs(2, 3, torch.float32, shape=(2, 9, 20))
    args[2] = args[2].detach().bfloat16().requires_grad_()
    args[3] = args[3].detach().bfloat16().requires_grad_()
    outputs, grads = all_grads(route_sources_fused, args, 3)
    lean_outputs, lean_grads = all_grads(route_sources, args, 3)
    assert outputs[0].dtype == torch.float32
    assert grads[2].dtype == grads[3].dtype == torch.bfloat16 and grads[1].dtype == torch.float32
    assert_all_close(outputs, lean_outputs, rtol=1e-5, atol=1e-5)
    assert_all_close(grads, lean_grads, rtol=1e-2, atol=1e-2)  # bf16 gradients: one rounding apart at most
    assert_all_close(grads[:2] + grads[4:], lean_grads[:2] + lean_grads[4:], rtol=1e-5, atol=1e-4)


def test_all_bf16_sources_give_a_bf16_mixture_rounded_once():
    args = inputs(1, 3, torch.bfloat16, shape=(2, 6, 16))
    queries, sources, inv = split(args, 3)
    mixed, lse, weights = route_sources_fused(queries, sources, inv)
    assert mixed.dtype == torch.bfloat16 and lse.dtype == weights.dtype == torch.float32
    exact = sum(weights[..., i, None].double() * v.double() for i, v in enumerate(sources))
    torch.testing.assert_close(mixed, exact.bfloat16(), rtol=0, atol=0)  # fp32 accumulation, one rounding


def test_odd_sizes_partial_tiles_and_threads():
    """D not a multiple of the vector width, a partial last tile of tokens, 1 and 2 threads."""
    num_sources = 5
    args = inputs(3, num_sources, torch.float32, shape=(3, 157, 13))  # 471 tokens: tiles of 64, the last partial
    outputs, grads = all_grads(route_sources_fused, args, num_sources)
    lean_outputs, lean_grads = all_grads(route_sources, args, num_sources)
    assert_all_close(outputs, lean_outputs, rtol=1e-5, atol=1e-5)
    assert_all_close(grads, lean_grads, rtol=1e-4, atol=1e-4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_outputs, one_grads = all_grads(route_sources_fused, args, num_sources)
    finally:
        torch.set_num_threads(threads)
    assert_all_close(one_outputs, outputs, rtol=0, atol=0)  # no reduction crosses tokens in forward
    assert_all_close(one_grads, grads, rtol=1e-5, atol=1e-5)


def test_non_contiguous_inputs():
    num_sources = 3
    args = inputs(2, num_sources, torch.float32, shape=(4, 6, 10))
    queries, sources, inv = split(args, num_sources)
    # The same values through strided views: transposed batch and time, queries from a wider matrix.
    strided_q = torch.cat([queries, queries], dim=1)[:, ::2].detach().requires_grad_()
    with torch.no_grad():
        strided_q.copy_(queries)
    strided_sources = [v.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_() for v in sources]
    strided_inv = [r.detach().t().contiguous().t().requires_grad_() for r in inv]
    strided = [strided_q, *strided_sources, *strided_inv]
    assert not any(t.is_contiguous() for t in strided)
    outputs, grads = all_grads(route_sources_fused, strided, num_sources)
    expected_outputs, expected_grads = all_grads(route_sources_fused, args, num_sources)
    assert_all_close(outputs, expected_outputs, rtol=0, atol=0)
    assert_all_close(grads, expected_grads, rtol=1e-6, atol=1e-6)


def test_saves_only_references_and_per_token_scalars():
    """method §5: no stacked copy of the sources and no normalised keys kept for backward."""
    args = inputs(2, 4, torch.float32, shape=(2, 16, 32))
    queries, sources, inv = split(args, 4)
    allowed = {t.untyped_storage().data_ptr() for t in (queries, *sources, *inv)}
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, _, weights = route_sources_fused(queries, sources, inv)
    assert saved
    for tensor in saved:
        assert tensor.untyped_storage().data_ptr() in allowed or tensor.numel() <= weights.numel(), tensor.shape
    new_bytes = sum(t.untyped_storage().nbytes() for t in saved if t.untyped_storage().data_ptr() not in allowed)
    assert new_bytes <= weights.untyped_storage().nbytes()


def test_autocast_does_not_change_it():
    args = inputs(1, 4, torch.float32)
    expected = route_sources_fused(*split(args, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = route_sources_fused(*split(args, 4))
    assert_all_close(got, expected, rtol=0, atol=0)


@pytest.mark.compile
def test_torch_compile_fullgraph_forward_and_backward():
    num_sources = 3
    args = inputs(2, num_sources, torch.float32, shape=(2, 5, 8))

    def routed(queries, sources, inv):
        mixed, lse, weights = route_sources_fused(queries * 1.5, sources, inv)
        return mixed.sum(0) * 2, lse, weights

    # Any graph break fails. (The inductor backend works too: checked by hand, 30 s more.)
    compiled = torch.compile(routed, fullgraph=True, backend="aot_eager")
    outputs, grads = all_grads(compiled, args, num_sources)
    eager_outputs, eager_grads = all_grads(routed, args, num_sources)
    assert_all_close(outputs, eager_outputs, rtol=1e-6, atol=1e-6)
    assert_all_close(grads, eager_grads, rtol=1e-6, atol=1e-6)


def test_auto_picks_fused_on_cpu_once_built_and_route_fast_dispatches():
    args = inputs(2, 3, torch.float32)
    assert extension_path().is_file() and fused_available()  # built by the tests above
    assert resolve_impl("auto", torch.device("cpu")) == "fused"
    assert resolve_impl("fused", torch.device("cpu")) == "fused"
    assert_all_close(route_fast(*split(args, 3), "fused"), route_sources_fused(*split(args, 3)), rtol=0, atol=0)


def test_auto_picks_fused_when_compiling_with_and_without_gradients():
    """A compiled decode step too: the kernels are single calls in its graph, which compiles in about
    half the time of the lean ops' plain PyTorch (docs/explanation/fast-paths.md)."""
    seen = []

    def resolved(x):
        seen.append(resolve_impl("auto", x.device))
        return x + 1

    compiled = torch.compile(resolved, fullgraph=True, backend="eager")
    x = torch.zeros(2)
    with torch.no_grad():
        compiled(x)
    compiled(x.clone().requires_grad_())
    assert seen == ["fused", "fused"]


@pytest.mark.parametrize("dtypes", [(torch.float64,) * 3, (torch.float32, torch.bfloat16, torch.bfloat16)],
                         ids=["float64", "fp32+bf16"])
def test_inv_computed_in_the_kernel_equals_inv_rms_then_routing(dtypes):
    """inv=None, eps: the kernel computes inv_rms in its logits pass, and its gradient in backward."""
    compute = dtypes[0]
    args = inputs(3, len(dtypes), compute, shape=(2, 7, 11))[:1 + len(dtypes)]
    args = [args[0]] + [v.detach().to(dt).requires_grad_() for v, dt in zip(args[1:], dtypes)]

    def fused(queries, *sources):
        return route_sources_fused(queries, list(sources), None, eps=EPS)

    def composed(queries, *sources):
        return route_sources(queries, list(sources), [inv_rms(v, EPS) for v in sources])

    outputs = fused(*args)
    grads_out = upstream(outputs)
    grads = torch.autograd.grad(outputs, args, grads_out)
    expected = composed(*args)
    expected_grads = torch.autograd.grad(expected, args, grads_out)
    tol = 1e-10 if compute == torch.float64 else 1e-5
    assert_all_close(outputs, expected, rtol=tol, atol=tol)
    assert_all_close(grads[:2], expected_grads[:2], rtol=tol, atol=tol)
    assert_all_close(grads[2:], expected_grads[2:], rtol=1e-2 if compute != torch.float64 else tol,
                     atol=1e-2 if compute != torch.float64 else tol)
    if compute == torch.float64:
        assert torch.autograd.gradcheck(fused, args)


def test_inv_computed_in_the_kernel_saves_only_references():
    args = inputs(1, 3, torch.float32, shape=(2, 16, 32))
    queries, sources, _ = split(args, 3)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _, _, weights = route_sources_fused(queries, sources, None, eps=EPS)
    allowed = {t.untyped_storage().data_ptr() for t in (queries, *sources)}
    assert all(t.untyped_storage().data_ptr() in allowed or t.numel() <= weights.numel() for t in saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("computed_inv", [False, True])
def test_split_results_are_the_stacked_ones_in_buffers_of_their_own(dtype, computed_inv):
    """route_sources_fused_split (compiled steps without gradients): each router's mixture and
    log-sum-exp in a tensor of its own, starting at its offset 0, with the stacked op's values."""
    queries, sources, inv = split(inputs(3, 4, dtype), 4)
    inv = None if computed_inv else inv
    with torch.no_grad():
        stacked, lse, weights = route_sources_fused(queries, sources, inv, eps=EPS)
        mixed_each, lse_each, weights_split = route_sources_fused_split(queries, sources, inv, eps=EPS)
    assert len(mixed_each) == len(lse_each) == 3
    for part in (*mixed_each, *lse_each):
        assert not part._is_view() and part.storage_offset() == 0
    assert len({t.untyped_storage().data_ptr() for t in (*mixed_each, *lse_each)}) == 6
    torch.testing.assert_close(torch.stack(mixed_each), stacked, rtol=0, atol=0)
    torch.testing.assert_close((torch.stack(lse_each), weights_split), (lse, weights), rtol=0, atol=0)


def test_the_filling_op_refuses_buffers_that_do_not_fit():
    """route_forward_into (under route_sources_fused_split) writes into the buffers it is given: one
    per router, each contiguous and of the mixture's and the statistics' shape and dtype."""
    queries, sources, _ = split(inputs(2, 3, torch.float32), 3)
    into = torch.ops.attnres_fused_cpu.route_forward_into
    mixed, lse = [torch.empty_like(sources[0]) for _ in range(2)], [torch.empty(sources[0].shape[:-1])] * 2
    with pytest.raises(ValueError, match="one mixture and one lse buffer per router"):
        into(queries, sources, [], EPS, mixed[:1], lse)
    with pytest.raises(ValueError, match="router 1's buffers must be contiguous"):
        into(queries, sources, [], EPS, [mixed[0], mixed[1].double()], lse)
    with torch.no_grad():
        expected, _, _ = route_sources_fused(queries, sources, None, eps=EPS)
    into(queries, sources, [], EPS, mixed, [torch.empty(sources[0].shape[:-1]) for _ in range(2)])
    torch.testing.assert_close(torch.stack(mixed), expected, rtol=0, atol=0)


def test_split_refuses_to_lose_a_gradient():
    queries, sources, inv = split(inputs(2, 3, torch.float32), 3)
    with pytest.raises(ValueError, match="computes no gradients"):
        route_sources_fused_split(queries.requires_grad_(), sources, inv)


@pytest.mark.parametrize("used", [(0, 1, 2), (1,)], ids=["every-router", "one-router"])
@pytest.mark.parametrize("computed_inv", [False, True])
def test_each_router_its_own_mixture(used, computed_inv):
    """each=True: the S mixtures as tensors of their own (not views of one stacked tensor), equal to
    the stacked result, with the same gradients also when only some routers' mixtures are used."""
    args = inputs(3, 4, torch.float32)
    queries, sources, inv = split(args, 4)
    inv = None if computed_inv else inv
    stacked, lse, weights = route_sources_fused(queries, sources, inv, eps=EPS)
    each, lse_each, weights_each = route_sources_fused(queries, sources, inv, eps=EPS, each=True)
    assert len(each) == 3 and not any(m._is_view() for m in each)
    assert len({m.untyped_storage().data_ptr() for m in each}) == 3
    for s, mixture in enumerate(each):
        torch.testing.assert_close(mixture, stacked[s], rtol=0, atol=0)
    torch.testing.assert_close((lse_each, weights_each), (lse, weights), rtol=0, atol=0)
    grads = [torch.randn_like(mixture) for mixture in each]
    expected = torch.autograd.grad(sum((stacked[s] * grads[s]).sum() for s in used) + lse.sum(), args,
                                   allow_unused=True)
    got = torch.autograd.grad(sum((each[s] * grads[s]).sum() for s in used) + lse_each.sum(), args,
                              allow_unused=True)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_clear_errors():
    queries, sources, inv = split(inputs(1, 2, torch.float32), 2)
    with pytest.raises(ValueError, match="at least one source"):
        route_sources_fused(queries, [], [], eps=EPS)
    with pytest.raises(ValueError, match="needs inv, or eps"):
        route_sources_fused(queries, sources, None)
    with pytest.raises(ValueError, match="every source must be"):
        route_sources_fused(queries, [sources[0], sources[1][:, :3]], [inv[0], inv[1][:, :3]])
    with pytest.raises(ValueError, match="queries must be"):
        route_sources_fused(queries[:, :4], sources, inv)
    with pytest.raises(TypeError, match="dtype"):
        route_sources_fused(queries, [sources[0], sources[1].int()], inv)
    with pytest.raises(ValueError, match="not for meta"):
        resolve_impl("fused", torch.device("meta"))


# ---------------------------------------------------------------- phase 2: the fused merge

def merge_inputs(dtypes, shape=(2, 5, 12), mixed_dtype=None, seed=0):
    """(mixed, lse, query, sources (one per dtype), inv), all leaves requiring grad: a phase-1 result
    of mixed_dtype (default: the first source's) with fp32 lse (float64 for float64), and later sources."""
    generator = torch.Generator().manual_seed(seed)
    compute = torch.float64 if torch.float64 in dtypes else torch.float32
    mixed_dtype = mixed_dtype or dtypes[0]
    mixed = torch.randn(shape, generator=generator, dtype=torch.float64).to(mixed_dtype)
    lse = (2 * torch.randn(shape[:-1], generator=generator, dtype=torch.float64)).to(compute)
    query = torch.randn(shape[-1], generator=generator, dtype=torch.float64).to(compute)
    sources = [(torch.randn(shape, generator=generator, dtype=torch.float64) * (i + 1)).to(dt)
               for i, dt in enumerate(dtypes)]
    inv = [inv_rms(v, EPS).detach() * (1 + 0.1 * torch.rand(shape[:-1], generator=generator, dtype=compute))
           for v in sources]
    return [t.requires_grad_() for t in (mixed, lse, query, *sources, *inv)]


def python_merge(mixed, lse, query, *tensors, computed_inv=False):
    """two_phase's PyTorch-ops merge (`_merge_forward`, `_merge_backward`); computed_inv: tensors are
    the sources only, their inv_rms computed first (gradients through it)."""
    sources = list(tensors) if computed_inv else list(tensors[:len(tensors) // 2])
    inv = [inv_rms(v, EPS) for v in sources] if computed_inv else list(tensors[len(sources):])
    return _PythonMerge.apply(mixed, lse, query, len(sources), *sources, *inv)


def fused_merge(mixed, lse, query, *tensors, computed_inv=False):
    if computed_inv:
        return merge_sources_fused(mixed, lse, query, list(tensors), None, eps=EPS)
    n = len(tensors) // 2
    return merge_sources_fused(mixed, lse, query, list(tensors[:n]), list(tensors[n:]))


def merge_grads(fn, args, grads_out=None, **kwargs):
    """(outputs, gradients of <outputs, upstream> w.r.t. every input) of fn(*args)."""
    outputs = fn(*args, **kwargs)
    grads_out = upstream(outputs, seed=3) if grads_out is None else grads_out
    keep = [(o, g) for o, g in zip(outputs, grads_out) if g is not None]
    return outputs, torch.autograd.grad([o for o, _ in keep], args, [g for _, g in keep], allow_unused=True)


@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 5e-5)], ids=["float64", "fp32"])
@pytest.mark.parametrize("num_sources", [1, 2, 3])
def test_merge_equals_the_python_merge(num_sources, dtype, tol, computed_inv):
    args = merge_inputs((dtype,) * num_sources)
    if computed_inv:
        args = args[:3 + num_sources]
    outputs, grads = merge_grads(fused_merge, args, computed_inv=computed_inv)
    expected, expected_grads = merge_grads(python_merge, args, computed_inv=computed_inv)
    assert outputs[0].dtype == dtype and outputs[1].dtype == outputs[2].dtype == outputs[3].dtype == args[1].dtype
    assert_all_close(outputs, expected, rtol=tol, atol=tol)
    assert_all_close(grads, expected_grads, rtol=tol, atol=tol)


@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
@pytest.mark.parametrize("present", list(itertools.product([False, True], repeat=4)),
                         ids=lambda p: "+".join(n for n, k in zip(("out", "total", "keep", "take"), p) if k) or "none")
def test_merge_backward_any_subset_of_upstream_gradients(present, computed_inv):
    """The backward functions themselves, every subset of upstream gradients None (all None included)."""
    num_sources = 3
    mixed, lse, query, *rest = [t.detach() for t in merge_inputs((torch.float64,) * num_sources, shape=(2, 7, 9))]
    sources, inv = rest[:num_sources], rest[num_sources:]
    true_inv = [inv_rms(v, EPS) for v in sources]
    out, total, keep, take = _merge_forward(mixed, lse, query, sources, true_inv if computed_inv else inv)
    grads_out = [g if k else None for g, k in zip(upstream((out, total, keep, take), seed=4), present)]
    got = _fused_merge_backward(query, out, keep, take, sources, [] if computed_inv else inv, mixed.dtype,
                                *grads_out, eps=EPS)
    expected = list(_merge_backward(query, out, keep, take, sources, true_inv if computed_inv else inv, mixed.dtype,
                                    *grads_out))
    if computed_inv:  # the reference chains d inv through inv_rms into d sources
        expected[3] = [g + _inv_rms_backward(v, r, d)
                       for g, v, r, d in zip(expected[3], sources, true_inv, expected[4])]
        expected[4] = []
    assert len(got) == len(expected) == 5
    assert_all_close(got[:3], expected[:3], rtol=1e-10, atol=1e-10)
    assert_all_close(got[3] + got[4], expected[3] + expected[4], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtypes, mixed_dtype", [((torch.bfloat16,), torch.float32),
                                                 ((torch.float32, torch.bfloat16, torch.bfloat16), torch.float32),
                                                 ((torch.bfloat16, torch.bfloat16), torch.bfloat16),
                                                 ((torch.float16, torch.float32), torch.bfloat16)],
                         ids=["bf16-into-fp32", "fp32+bf16-into-fp32", "all-bf16", "fp16+fp32-into-bf16"])
@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
def test_merge_bf16_and_mixed_dtypes(dtypes, mixed_dtype, computed_inv):
    args = merge_inputs(dtypes, shape=(2, 9, 20), mixed_dtype=mixed_dtype)
    if computed_inv:
        args = args[:3 + len(dtypes)]
    outputs, grads = merge_grads(fused_merge, args, computed_inv=computed_inv)
    expected, expected_grads = merge_grads(python_merge, args, computed_inv=computed_inv)
    out_dtype = mixed_dtype
    for dt in dtypes:
        out_dtype = torch.promote_types(out_dtype, dt)
    assert outputs[0].dtype == out_dtype and outputs[3].dtype == torch.float32
    assert [g.dtype for g in grads] == [a.dtype for a in args]
    low = out_dtype != torch.float32  # a bf16 output is one rounding of the same fp32 value
    assert_all_close(outputs[:1], expected[:1], rtol=1e-2 if low else 1e-5, atol=1e-2 if low else 1e-5)
    assert_all_close(outputs[1:], expected[1:], rtol=1e-5, atol=1e-5)
    assert_all_close(grads, expected_grads, rtol=1e-2, atol=1e-2)  # bf16 gradients: one rounding apart at most
    exact = [(a, b) for a, b, t in zip(grads, expected_grads, args) if t.dtype == torch.float32]
    assert_all_close([a for a, _ in exact], [b for _, b in exact], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
@pytest.mark.parametrize("num_sources", [1, 3])
def test_merge_gradcheck_float64(num_sources, computed_inv):
    args = merge_inputs((torch.float64,) * num_sources, shape=(2, 3, 6))
    if computed_inv:
        args = args[:3 + num_sources]
    assert torch.autograd.gradcheck(lambda *a: fused_merge(*a, computed_inv=computed_inv), args)


def test_merge_odd_sizes_partial_tiles_and_threads():
    """D not a multiple of the vector width, a partial last tile, 1 and 2 threads."""
    args = merge_inputs((torch.float32,) * 3, shape=(3, 157, 13))
    outputs, grads = merge_grads(fused_merge, args)
    expected, expected_grads = merge_grads(python_merge, args)
    assert_all_close(outputs, expected, rtol=5e-5, atol=5e-5)
    assert_all_close(grads, expected_grads, rtol=5e-5, atol=5e-5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_outputs, one_grads = merge_grads(fused_merge, args)
    finally:
        torch.set_num_threads(threads)
    assert_all_close(one_outputs, outputs, rtol=0, atol=0)  # no reduction crosses tokens in forward
    assert_all_close(one_grads, grads, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
def test_merge_saves_its_output_and_references_never_the_mixture(computed_inv):
    mixed, lse, query, *rest = merge_inputs((torch.float32,) * 2, shape=(2, 16, 32))
    sources, inv = rest[:2], [] if computed_inv else rest[2:]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out, _, _, take = merge_sources_fused(mixed, lse, query, sources, inv or None, eps=EPS)
    allowed = {t.untyped_storage().data_ptr() for t in (query, out, *sources, *inv)}
    assert saved and mixed.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in saved}
    assert all(t.untyped_storage().data_ptr() in allowed or t.numel() <= take.numel() for t in saved)


@pytest.mark.compile
@pytest.mark.parametrize("computed_inv", [False, True], ids=["inv", "inv-in-kernel"])
def test_merge_under_torch_compile_fullgraph_equals_eager(computed_inv):
    args = merge_inputs((torch.float32, torch.bfloat16), shape=(2, 5, 8))
    if computed_inv:
        args = args[:5]

    def merged(mixed, lse, query, *tensors):
        out, total, keep, take = fused_merge(mixed * 1.5, lse, query, *tensors, computed_inv=computed_inv)
        return out * 2, total, keep, take

    compiled = torch.compile(merged, fullgraph=True, backend="aot_eager")  # any graph break fails
    outputs, grads = merge_grads(compiled, args)
    eager_outputs, eager_grads = merge_grads(merged, args)
    assert_all_close(outputs, eager_outputs, rtol=1e-6, atol=1e-6)
    assert_all_close(grads, eager_grads, rtol=1e-6, atol=1e-6)


def test_merge_clear_errors():
    mixed, lse, query, *rest = merge_inputs((torch.float32,) * 2)
    sources, inv = rest[:2], rest[2:]
    with pytest.raises(ValueError, match="needs inv, or eps"):
        merge_sources_fused(mixed, lse, query, sources, None)
    with pytest.raises(ValueError, match="mixed must be|needs mixed"):
        merge_sources_fused(mixed[:, :3], lse, query, sources, inv)
    with pytest.raises(ValueError, match=r"query.*\(D,\)"):
        merge_sources_fused(mixed, lse, query[None], sources, inv)
    with pytest.raises(ValueError, match="one inv per source"):
        merge_sources_fused(mixed, lse, query, sources, inv[:1])
