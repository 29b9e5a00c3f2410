"""Every fast routing path computes the reference's function: forward, routing weights, gradients.

The fast paths (routing_impl "lean", "fused" (the C++ CPU op), and "triton" under Triton's CPU
interpreter when installed) use cached inverse RMS, the memory-lean or fused custom op and two-phase
block routing (method §5); the reference path calls each Router's plain method §2 code. Checked for
every variant in float64, fp32 and bf16 autocast, and with activation checkpointing.
tests/model/test_compile.py compiles the default path with fullgraph=True, which fails on any graph break.
"""

import dataclasses
import os

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.routing.triton_route import triton_available
from tests.helpers import activate_routing

VARIANTS = [("full_attnres", None, None), ("block_attnres", 4, None), ("block_attnres", 3, None),
            ("delta_attnres", None, None), ("delta_block", 4, None), ("delta_block", 3, "gate"),
            ("delta_block", 4, "partial"), ("delta_block", 1, None)]
IDS = [f"{r}-N{n}-{e}" for r, n, e in VARIANTS]
# The CPU fast paths: the lean PyTorch ops and the fused C++ op (its extension is built on first use).
FAST_CPU_IMPLS = ["lean", "fused"]
# fp32 absolute tolerance per path. The fused kernel sums its dot products in another order than
# the reference's matmuls: against a float64 run of the same weights, its gradients are as close as
# the reference's own (both within ~1e-4 relative), but the two fp32 paths can differ by 3e-5.
FP32_ATOL = {"lean": 1e-5, "fused": 5e-5}


def pair(residual, num_blocks, exact, impl, dtype=torch.float32):
    """(reference model, fast model) with identical weights and non-zero routing."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual=residual, num_blocks=num_blocks,
                         exact_conversion=exact, max_seq_len=64, routing_impl="reference")
    reference = AttnResLM(config).to(dtype)
    activate_routing(reference.routers)
    with torch.no_grad():
        for router in reference.routers:
            router.key_norm.weight.uniform_(0.5, 1.5)
    fast = AttnResLM(dataclasses.replace(config, routing_impl=impl)).to(dtype)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def run(model, ids, autocast=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(ids, labels=ids, return_routing=True)
    out.loss.backward()
    module = getattr(model, "_orig_mod", model)  # a compiled model wraps the original
    grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
    return out, grads


def assert_same(got, expected, rtol, atol):
    (out, grads), (ref_out, ref_grads) = got, expected
    torch.testing.assert_close(out.logits, ref_out.logits, rtol=rtol, atol=atol)
    assert len(out.routing) == len(ref_out.routing)
    for weights, ref_weights in zip(out.routing, ref_out.routing):
        torch.testing.assert_close(weights, ref_weights, rtol=rtol, atol=atol)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=rtol, atol=atol, msg=name)


IDS_IN = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("impl", FAST_CPU_IMPLS)
@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS, ids=IDS)
def test_fast_equals_reference_float64(residual, num_blocks, exact, impl):
    reference, fast = pair(residual, num_blocks, exact, impl, torch.float64)
    assert_same(run(fast, IDS_IN), run(reference, IDS_IN), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", FAST_CPU_IMPLS)
@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS, ids=IDS)
def test_fast_equals_reference_fp32_and_bf16_autocast(residual, num_blocks, exact, impl):
    reference, fast = pair(residual, num_blocks, exact, impl)
    assert_same(run(fast, IDS_IN), run(reference, IDS_IN), rtol=1e-5, atol=FP32_ATOL[impl])
    # bf16: both paths round the sub-layers' matmuls the same way; routing statistics stay fp32.
    assert_same(run(fast, IDS_IN, autocast=True), run(reference, IDS_IN, autocast=True), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("impl", FAST_CPU_IMPLS)
@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS, ids=IDS)
def test_fast_under_activation_checkpointing(residual, num_blocks, exact, impl):
    reference, fast = pair(residual, num_blocks, exact, impl)
    fast.activation_checkpointing = True
    assert_same(run(fast, IDS_IN), run(reference, IDS_IN), rtol=1e-5, atol=FP32_ATOL[impl])


@pytest.mark.skipif(not triton_available(), reason="needs Triton with CUDA, or its interpreter (tests/conftest.py)")
@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS, ids=IDS)
def test_triton_equals_reference(residual, num_blocks, exact):
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    reference, fast = pair(residual, num_blocks, exact, "triton")
    ids = IDS_IN.to(device)
    got = run(fast.to(device), ids)
    assert_same(got, run(reference.to(device), ids), rtol=1e-5, atol=5e-5)  # other summation order


@pytest.mark.parametrize("impl", ["reference", "lean"])
@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS, ids=IDS)
def test_every_path_calls_every_router_as_a_module(residual, num_blocks, exact, impl):
    """Forward hooks see each router once per forward, with the sources `source_names` lists and the
    weights it returns, on the two-phase block paths too: analysis never has to switch paths."""
    reference, fast = pair(residual, num_blocks, exact, "reference")
    model = reference if impl == "reference" else fast
    model.residual.impl = impl
    calls = []
    for r, router in enumerate(model.routers):
        router.register_forward_hook(lambda m, args, kwargs, out, r=r: calls.append((r, len(args[0]), out[1])),
                                     with_kwargs=True)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    out = model(ids, return_routing=True)
    names = model.residual.source_names()
    assert [(r, n) for r, n, _ in calls] == [(r, len(names[r])) for r in range(len(model.routers))]
    assert all(torch.equal(seen, returned) for (_, _, seen), returned in zip(calls, out.routing))
