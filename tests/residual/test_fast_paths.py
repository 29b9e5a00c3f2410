"""Every fast routing path computes the reference's function: forward, routing weights, gradients.

The fast paths (routing_impl "lean", "fused" (the C++ CPU op), and "triton" under Triton's CPU
interpreter when installed) use cached inverse RMS, the memory-lean or fused custom op and two-phase
block routing (method §5); the reference path calls each Router's plain method §2 code. Checked for
every variant in float64, fp32 and bf16 autocast, and with activation checkpointing.
tests/model/test_compile.py compiles the default path with fullgraph=True, which fails on any graph break.
"""

import os

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.routing.triton_route import triton_available
from tests.helpers import activate_routing, needs_fused_cpu

VARIANTS = [("full_attnres", None, None), ("block_attnres", 4, None), ("block_attnres", 3, None),
            ("delta_attnres", None, None), ("delta_block", 4, None), ("delta_block", 3, "gate"),
            ("delta_block", 4, "partial"), ("delta_block", 1, None)]
IDS = [f"{r}-N{n}-{e}" for r, n, e in VARIANTS]
# The CPU fast paths: the lean PyTorch ops and the fused C++ op (built on first use; skipped, saying
# why, where it is not built and no C++ compiler is there to build it).
FAST_CPU_IMPLS = ["lean", pytest.param("fused", marks=needs_fused_cpu)]
# fp32 absolute tolerance per path. The fused kernel sums its dot products in another order than
# the reference's matmuls: against a float64 run of the same weights, its gradients are as close as
# the reference's own (both within ~1e-4 relative), but the two fp32 paths can differ by 3e-5.
FP32_ATOL = {"lean": 1e-5, "fused": 5e-5}


def options_of(**values):
    """A variant's residual_options from the values given (None: not given, the option's default)."""
    return {name: value for name, value in values.items() if value is not None}


def pair(residual, num_blocks, exact, impl, dtype=torch.float32):
    """(reference model, fast model) with identical weights and non-zero routing."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual=residual,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact), max_seq_len=64)
    reference = AttnResLM(config).set_routing("reference").to(dtype)
    activate_routing(reference.routers)
    with torch.no_grad():
        for router in reference.routers:
            router.key_norm.weight.uniform_(0.5, 1.5)
    fast = AttnResLM(config).set_routing(impl).to(dtype)
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
    """Elementwise closeness; atol is relative to each tensor's largest |value| when that exceeds 1: a
    gradient entry summed from terms as large as the tensor's largest ones carries their rounding error
    (an embedding gradient entry of 0.09 out of terms up to 3.2 differed by 1.2e-5 in fp32 between the
    lean and the reference path on an AMX CPU, where the reference's own error against float64 is 2.1e-5)."""
    (out, grads), (ref_out, ref_grads) = got, expected

    def close(actual, wanted, msg=None):
        scale = max(1.0, wanted.detach().abs().max().item()) if wanted.numel() else 1.0
        torch.testing.assert_close(actual, wanted, rtol=rtol, atol=atol * scale, msg=msg)

    close(out.logits, ref_out.logits)
    assert len(out.routing) == len(ref_out.routing)
    for weights, ref_weights in zip(out.routing, ref_out.routing):
        close(weights, ref_weights)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        close(grads[name], ref_grads[name], msg=name)


def tensors(result):
    """A run's logits, routing weights and gradients by name."""
    out, grads = result
    return {"logits": out.logits, **{f"routing[{i}]": w for i, w in enumerate(out.routing)}, **grads}


# bf16 autocast: two valid computations that order and round the sub-layers' matmuls differently differ
# by more than any fixed elementwise tolerance on some CPUs (native AVX-512 BF16/AMX ones round otherwise
# than AVX2 ones). So each path is judged against the fp32 result of the same weights: per tensor, the
# fast path's bf16 error (L2 norm) may be at most BF16_ERROR_FACTOR x the reference path's own bf16
# error, plus a floor of one bf16 rounding (2^-9) of the tensor's norm for tensors both compute almost
# exactly. Measured on an AMX CPU: the ratio is at most 1.31 over every variant and chunk size.
BF16_ERROR_FACTOR = 2.0
BF16_UNIT_ROUNDOFF = 2.0 ** -9


def assert_as_accurate_under_bf16(fast, reference, fp32):
    """fast and reference: runs under bf16 autocast; fp32: the fp32 reference run of the same weights."""
    got, ref, truth = tensors(fast), tensors(reference), tensors(fp32)
    assert got.keys() == ref.keys() == truth.keys()
    worse = {}
    for name, value in truth.items():
        value = value.detach().double()
        error = torch.linalg.vector_norm(got[name].detach().double() - value).item()
        ref_error = torch.linalg.vector_norm(ref[name].detach().double() - value).item()
        bound = BF16_ERROR_FACTOR * ref_error + BF16_UNIT_ROUNDOFF * torch.linalg.vector_norm(value).item()
        if not error <= bound:
            worse[name] = f"error {error:.3g} > {bound:.3g} (reference's own error {ref_error:.3g})"
    assert not worse, worse


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
    fp32 = run(reference, IDS_IN)
    assert_same(run(fast, IDS_IN), fp32, rtol=1e-5, atol=FP32_ATOL[impl])
    # bf16: as accurate as the reference path against fp32, not elementwise equal to it (see above).
    assert_as_accurate_under_bf16(run(fast, IDS_IN, autocast=True), run(reference, IDS_IN, autocast=True), fp32)


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
