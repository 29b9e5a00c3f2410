"""The Kimi router ablations (method §7) as Router options: an input-dependent query, sigmoid weights,
raw keys. Each is checked against a float64 loop written from the definitions, by gradcheck, and at
initialisation against the method's router.
"""

import itertools

import pytest
import torch

from attnres.methods import Router

D = 8
OPTIONS = [dict(query=q, weights=w, key_norm=k)
           for q, w, k in itertools.product(("static", "input_dependent"), ("softmax", "sigmoid"), (True, False))]
IDS = [f"{o['query']}-{o['weights']}-{'norm' if o['key_norm'] else 'raw'}" for o in OPTIONS]


def naive(router: Router, sources, stream):
    """Token by token, source by source, in float64: z_i = q_t . key(v_i), alpha = softmax or sigmoid."""
    B, T, _ = sources[0].shape
    eps = router.eps
    mixed = torch.zeros(B, T, D, dtype=torch.float64)
    alpha = torch.zeros(B, T, len(sources), dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            q = router.query.double().clone()
            if router.query_kind == "input_dependent":
                u = stream[b, t].double()
                u = u / torch.sqrt((u * u).mean() + eps)
                q = q + router.query_proj.double() @ u
            z = []
            for v in sources:
                k = v[b, t].double()
                if router.key_norm is not None:
                    k = k / torch.sqrt((k * k).mean() + eps) * router.key_norm.weight.double()
                z.append(float((q @ k).detach()))
            z = torch.tensor(z, dtype=torch.float64)
            a = torch.softmax(z, 0) if router.weight_kind == "softmax" else torch.sigmoid(z)
            alpha[b, t] = a
            mixed[b, t] = sum(a[i] * sources[i][b, t].double() for i in range(len(sources)))
    return mixed, alpha


def active_router(options, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    router = Router(D, eps=1e-6, **options).to(dtype)
    with torch.no_grad():
        router.query.normal_()
        if router.key_norm is not None:
            router.key_norm.weight.uniform_(0.5, 1.5)
        if router.query_proj is not None:
            router.query_proj.normal_(0.0, 0.5)
    return router


def inputs(n=4, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    sources = [torch.randn(2, 3, D, generator=g, dtype=dtype) * (1 + i) for i in range(n)]
    return sources, torch.randn(2, 3, D, generator=g, dtype=dtype) * 3


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_each_ablation_computes_its_definition(options):
    router = active_router(options)
    sources, stream = inputs()
    mixed, weights = router(sources, stream=stream if options["query"] == "input_dependent" else None)
    expected_mixed, expected_weights = naive(router, sources, stream)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mixed, expected_mixed, rtol=1e-12, atol=1e-12)
    if options["weights"] == "sigmoid":
        assert not torch.allclose(weights.sum(-1), torch.ones(2, 3, dtype=torch.float64))  # not normalised
    if options["query"] == "input_dependent":  # the same sources, another stream: other weights
        other, _ = router(sources, stream=stream.flip(0))
        assert not torch.allclose(other, mixed)


@pytest.mark.parametrize("options", [o for o in OPTIONS if o != OPTIONS[0]], ids=IDS[1:])
def test_gradcheck_of_each_ablated_router_in_float64(options):
    router = active_router(options)
    sources, stream = inputs(n=3)
    sources = [v.requires_grad_() for v in sources]
    stream.requires_grad_()
    params = [p for p in router.parameters()]
    names = [n for n, _ in router.named_parameters()]

    def mix(*tensors):
        srcs, u, values = list(tensors[:3]), tensors[3], tensors[4:]
        out, weights = torch.func.functional_call(router, dict(zip(names, values)), (srcs,),
                                                  {"stream": u if router.needs_stream else None})
        return out, weights

    assert torch.autograd.gradcheck(mix, (*sources, stream, *[p.detach().requires_grad_() for p in params]))


@pytest.mark.parametrize("options", OPTIONS[1:], ids=IDS[1:])
def test_at_initialisation_an_ablation_changes_only_what_it_claims(options):
    """Zero query (and zero query map): input-dependent queries and raw keys route uniformly like the
    method's router; sigmoid gives every source sigmoid(0) = 1/2."""
    torch.manual_seed(0)
    router, method = Router(D, **options).double(), Router(D).double()
    sources, stream = inputs()
    mixed, weights = router(sources, stream=stream)
    reference, uniform = method(sources)
    if options["weights"] == "sigmoid":
        assert torch.equal(weights, torch.full_like(weights, 0.5))
        torch.testing.assert_close(mixed, 0.5 * sum(sources), rtol=1e-14, atol=1e-14)
    else:
        assert torch.equal(weights, uniform)
        torch.testing.assert_close(mixed, reference, rtol=1e-14, atol=1e-14)


def test_the_method_router_alone_takes_the_fast_paths():
    assert Router(D).static_query and not Router(D).needs_stream
    for options in OPTIONS[1:]:
        router = Router(D, **options)
        assert not router.static_query
        assert router.needs_stream == (options["query"] == "input_dependent")
        assert (router.key_norm is None) == (not options["key_norm"])
        sources, stream = inputs(dtype=torch.float32)
        with pytest.raises(ValueError, match="reference code only"):
            router(sources, impl="lean", stream=stream)


def test_an_input_dependent_query_needs_the_stream_and_options_are_checked():
    sources, _ = inputs()
    with pytest.raises(ValueError, match="needs stream="):
        Router(D, query="input_dependent").double()(sources)
    with pytest.raises(ValueError, match=r"Router query must be one of \['static', 'input_dependent'\]"):
        Router(D, query="dynamic")
    with pytest.raises(ValueError, match=r"Router weights must be one of \['softmax', 'sigmoid'\]"):
        Router(D, weights="relu")
    with pytest.raises(ValueError, match="Router key_norm must be True or False"):
        Router(D, key_norm="no")


def test_reset_parameters_zeroes_the_query_map():
    router = active_router(dict(query="input_dependent", weights="softmax", key_norm=True))
    router.reset_parameters()
    assert torch.count_nonzero(router.query_proj) == 0 and torch.count_nonzero(router.query) == 0


@pytest.mark.parametrize("options", OPTIONS[1:], ids=IDS[1:])
def test_bf16_autocast_does_not_lower_the_routing_of_bf16_sources(options):
    """Query, logits and weights stay fp32 under autocast: the result equals the one without it."""
    router = active_router(options, dtype=torch.float32)
    sources, stream = inputs(dtype=torch.float32)
    sources, stream = [v.bfloat16() for v in sources], stream.bfloat16()
    plain_mixed, plain_weights = router(sources, stream=stream)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, weights = router(sources, stream=stream)
    assert weights.dtype == torch.float32 and mixed.dtype == torch.bfloat16
    assert torch.equal(weights, plain_weights) and torch.equal(mixed, plain_mixed)
