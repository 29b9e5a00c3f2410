"""The fused Triton router against a naive PyTorch reading of its contract.

Without a GPU the kernels run on CPU under the Triton interpreter. TRITON_INTERPRET must be on before
the kernels are decorated; triton_route decorates them lazily, on its first call, so setting the
variable here (before any call, and before triton is imported) is enough even if the module was
imported earlier. With a GPU the compiled kernels are tested. Shapes are tiny: the interpreter is
slow. Tile sizes are forced small so that D (48) spans a partial D tile and the token count is not a
multiple of the token block.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # with a GPU, test the compiled kernels instead
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from attnres.routing import triton_route  # noqa: E402
from attnres.routing.reference import route_reference  # noqa: E402
from attnres.routing.triton_route import route_sources_triton, triton_available  # noqa: E402

if not triton_available():  # e.g. TRITON_INTERPRET=0 was set outside and there is no GPU
    pytest.skip("Triton cannot run here (no CUDA device and TRITON_INTERPRET is off)", allow_module_level=True)

DEVICE = "cuda" if not triton_route._interpret_on() else "cpu"
D = 48  # not a power of two
TILES = dict(block_t=4, block_d=32)  # 2x3 = 6 tokens -> a partial token block; D = 48 -> a partial D tile


def naive_route(queries, sources, inv_rms):
    """The contract, plainly, in float64: loop over sources, then softmax over the stacked logits."""
    q = queries.double()
    logits = []
    for v, r in zip(sources, inv_rms):
        qb = q.reshape(q.shape[0], *([1] * (v.dim() - 1)), q.shape[1])  # (S, 1, 1, D) for (B, T, D) sources
        dots = (qb * v.double()[None]).sum(-1)  # (S, B, T)
        logits.append(r.double()[None] * dots)
    logits = torch.stack(logits, dim=-1)
    weights = torch.softmax(logits, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    mixed = sum(weights[..., i, None] * v.double()[None] for i, v in enumerate(sources))
    return mixed, lse, weights


def make_inputs(s, n, dtypes, b=2, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    queries = (0.3 * torch.randn(s, D, generator=g)).to(DEVICE)
    sources, inv_rms = [], []
    for i in range(n):
        dt = dtypes[i % len(dtypes)]
        v = (torch.randn(b, t, D, generator=g) * (1 + i)).to(dt).to(DEVICE)
        sources.append(v)
        inv_rms.append(torch.rsqrt(v.float().pow(2).mean(-1) + 1e-6))
    return queries, sources, inv_rms


def leaves(tensors, dtype=None):
    return [x.detach().to(dtype or x.dtype).requires_grad_() for x in tensors]


def check(actual, expected, rtol):
    """Close relative to the tensor's scale: |a - e| <= rtol * max(1, max|e|)."""
    expected = expected.double().cpu()
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual.double().cpu(), expected, rtol=0, atol=rtol * scale)


def run_both(queries, sources, inv_rms, grads_for=("mixed", "lse", "weights"), seed=1, **tiles):
    """Forward both implementations; backward both with the same random upstream grads for `grads_for`."""
    tq, tsrc, trinv = leaves([queries]), leaves(sources), leaves(inv_rms)
    out = route_sources_triton(tq[0], tsrc, trinv, **tiles)
    rq, rsrc, rrinv = leaves([queries], torch.float64), leaves(sources, torch.float64), leaves(inv_rms,
                                                                                                 torch.float64)
    ref = naive_route(rq[0], rsrc, rrinv)
    g = torch.Generator().manual_seed(seed)
    names = ("mixed", "lse", "weights")
    ups = {k: torch.randn(o.shape, generator=g, dtype=torch.float64).to(DEVICE) for k, o in zip(names, ref)}
    picked = [i for i, k in enumerate(names) if k in grads_for]
    got = torch.autograd.grad([out[i] for i in picked], tq + tsrc + trinv,
                              [ups[names[i]].to(out[i].dtype) for i in picked])
    # The reference sees the same upstream grads as the kernel did (rounded to the output dtype).
    want = torch.autograd.grad([ref[i] for i in picked], rq + rsrc + rrinv,
                               [ups[names[i]].to(out[i].dtype).double() for i in picked])
    return out, ref, got, want


@pytest.mark.parametrize("s", [1, 4])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_fp32_matches_naive(n, s):
    queries, sources, inv_rms = make_inputs(s, n, [torch.float32], seed=10 * n + s)
    # max_programs=1: the backward's single persistent program walks both token blocks.
    out, ref, got, want = run_both(queries, sources, inv_rms, max_programs=1 if n == 3 else None, **TILES)
    mixed, lse, weights = out
    assert mixed.shape == (s, 2, 3, D) and mixed.dtype == torch.float32
    assert lse.shape == (s, 2, 3) and weights.shape == (s, 2, 3, n)
    assert lse.dtype == weights.dtype == torch.float32
    for a, e in zip(out, ref):
        check(a, e, 1e-5)
    for a, e in zip(got, want):
        check(a, e, 1e-5)


@pytest.mark.parametrize("dtypes", [[torch.bfloat16], [torch.float32, torch.bfloat16, torch.float16]],
                         ids=["bf16", "fp32+bf16+fp16"])
def test_low_precision_and_mixed_sources(dtypes):
    n, s = 5, 4
    queries, sources, inv_rms = make_inputs(s, n, dtypes, seed=7)
    out, ref, got, want = run_both(queries, sources, inv_rms, **TILES)
    mixed, lse, weights = out
    promoted = torch.bfloat16 if len(dtypes) == 1 else torch.float32
    assert mixed.dtype == promoted
    # Everything is accumulated in fp32 from the exact source values; only results stored in a
    # 16-bit dtype (mixed when all sources are bf16, each source's gradient) carry its rounding.
    check(lse, ref[1], 1e-5)
    check(weights, ref[2], 1e-5)
    check(mixed, ref[0], 1e-2 if promoted == torch.bfloat16 else 1e-5)
    check(got[0], want[0], 1e-5)  # d queries
    for i, (a, e) in enumerate(zip(got[1:1 + n], want[1:1 + n])):
        assert a.dtype == sources[i].dtype
        check(a, e, 1e-5 if a.dtype == torch.float32 else 1e-2)
    for a, e in zip(got[1 + n:], want[1 + n:]):  # d inv_rms, fp32
        assert a.dtype == torch.float32
        check(a, e, 1e-5)


@pytest.mark.parametrize("grads_for", [("mixed",), ("lse",), ("weights",), ("lse", "weights")])
def test_upstream_grad_subsets(grads_for):
    # Default tile sizes here (one token block, one D tile).
    queries, sources, inv_rms = make_inputs(2, 3, [torch.float32], b=1, t=3, seed=3)
    _, _, got, want = run_both(queries, sources, inv_rms, grads_for=grads_for)
    for a, e in zip(got, want):
        check(a, e, 1e-5)


def test_matches_route_reference_without_stacking(monkeypatch):
    """S = 1 with queries = query * gain and inv_rms from the sources equals the reference router,
    gradients included (through inv_rms back to the sources); the op never stacks or concatenates."""
    g = torch.Generator().manual_seed(5)
    query = (0.5 * torch.randn(D, generator=g)).to(DEVICE).requires_grad_()
    gain = (1 + 0.3 * torch.randn(D, generator=g)).to(DEVICE).requires_grad_()
    sources = [(torch.randn(1, 5, D, generator=g) * (i + 1)).to(DEVICE).requires_grad_() for i in range(3)]
    eps = 1e-6
    ref_mixed, ref_weights = route_reference(query, gain, sources, eps)

    def forbidden(*args, **kwargs):
        raise AssertionError("route_sources_triton must not stack or concatenate the sources")

    inv_rms = [torch.rsqrt(v.float().pow(2).mean(-1) + eps) for v in sources]
    with monkeypatch.context() as m:
        m.setattr(torch, "stack", forbidden)
        m.setattr(torch, "cat", forbidden)
        mixed, _, weights = route_sources_triton((query * gain)[None], sources, inv_rms, **TILES)
        up = torch.randn_like(mixed[0])
        got = torch.autograd.grad((mixed[0] * up).sum() + weights[0, ..., 1].sum(), [query, gain, *sources])
    want = torch.autograd.grad((ref_mixed * up).sum() + ref_weights[..., 1].sum(), [query, gain, *sources])
    check(mixed[0], ref_mixed, 1e-5)
    check(weights[0], ref_weights, 1e-5)
    for a, e in zip(got, want):
        check(a, e, 1e-5)


def test_noncontiguous_source_and_errors(monkeypatch):
    queries, sources, inv_rms = make_inputs(1, 2, [torch.float32], b=1, t=3, seed=4)
    wide = torch.randn(1, 3, 2 * D, device=DEVICE)
    sources[1] = wide[..., ::2]  # a strided view
    inv_rms[1] = torch.rsqrt(sources[1].pow(2).mean(-1) + 1e-6)
    out, ref, got, want = run_both(queries, sources, inv_rms)
    for a, e in zip(list(out) + list(got), list(ref) + list(want)):
        check(a, e, 1e-5)

    # Any leading shape: (T, D) sources.
    flat = [v[0] for v in sources]
    out, ref, got, want = run_both(queries, flat, [r[0] for r in inv_rms])
    assert out[0].shape == (1, 3, D) and out[2].shape == (1, 3, 2)
    for a, e in zip(list(out) + list(got), list(ref) + list(want)):
        check(a, e, 1e-5)

    with pytest.raises(ValueError, match="at least one source"):
        route_sources_triton(queries, [], [])
    with pytest.raises(TypeError, match="dtype"):
        route_sources_triton(queries, [sources[0].double()], inv_rms[:1])
    monkeypatch.setattr(triton_route, "_triton_importable", lambda: False)
    with pytest.raises(RuntimeError, match="needs Triton"):
        route_sources_triton(queries, sources, inv_rms)
