"""Router micro-benchmark: the bytes accounting, the result fields, and the default routing call."""

import math

import pytest
import torch

from attnres.bench.bench_config import resolve_config
from attnres.bench.router_bench import copy_bytes, default_route_fn, router_bytes, run_router_bench
from attnres.routing import route_reference


def test_forward_bytes_read_every_source_once_and_write_the_output():
    # 3 sources of (2, 4, 8) bf16: 64 elements x 2 bytes = 128 bytes each.
    assert router_bytes(3, (2, 4, 8), torch.bfloat16) == {"read_bytes": 384, "written_bytes": 128, "total_bytes": 512}
    assert router_bytes(3, (2, 4, 8), torch.float32)["total_bytes"] == 1024


def test_forward_backward_bytes_add_the_backward_reads_and_source_gradients():
    # backward reads the 3 sources again plus the output gradient, writes 3 source gradients.
    moved = router_bytes(3, (2, 4, 8), torch.bfloat16, backward=True)
    assert moved == {"read_bytes": 384 + 384 + 128, "written_bytes": 128 + 384, "total_bytes": 1408}


def test_copy_moves_twice_its_size():
    assert copy_bytes(1000, torch.bfloat16) == 4000
    assert copy_bytes(1000, torch.float32) == 8000


def test_run_router_bench_reports_rates_against_the_copy():
    config = resolve_config("cpu", quick=True, hidden_size=16, seq_len=8, router_batch=2, router_sources=3,
                            warmup=0, precision="fp32")
    calls = []

    def fake_route(query, key_gain, sources, eps):
        calls.append(len(sources))
        return route_reference(query, key_gain, sources, eps)

    result = run_router_bench(config, route_fn=fake_route, log=lambda line: None)
    assert set(calls) == {3} and len(calls) == 2 * config.repeats  # forward and forward+backward per round
    assert result["shape"] == [2, 8, 16] and result["n_sources"] == 3 and result["dtype"] == "float32"
    assert result["function"].endswith("fake_route") and result["resolved_impl"] is None
    assert result["copy"]["bytes"] == copy_bytes(3 * 2 * 8 * 16, torch.float32)
    assert result["copy"]["bytes_per_s"] == pytest.approx(result["copy"]["bytes"] / result["copy"]["time"]["median_s"])
    for key, backward in (("forward", False), ("forward_backward", True)):
        part = result[key]
        assert part["bytes"] == router_bytes(3, (2, 8, 16), torch.float32, backward=backward)
        assert len(part["time"]["samples_s"]) == config.repeats
        assert part["bytes_per_s"] == pytest.approx(part["bytes"]["total_bytes"] / part["time"]["median_s"])
        assert part["fraction_of_copy"] == pytest.approx(part["bytes_per_s"] / result["copy"]["bytes_per_s"])


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_default_route_fn_computes_the_reference_routing(impl):
    generator = torch.Generator().manual_seed(0)
    sources = [torch.randn(2, 3, 8, generator=generator) for _ in range(4)]
    query, gain = torch.randn(8, generator=generator), 1 + 0.1 * torch.randn(8, generator=generator)
    out = default_route_fn(impl)(query, gain, sources, 1e-6)
    mixed = out[0] if isinstance(out, tuple) else out
    expected, _ = route_reference(query, gain, sources, 1e-6)
    assert mixed.shape == (2, 3, 8)
    assert torch.allclose(mixed, expected, atol=1e-5)
    assert math.isfinite(float(mixed.sum()))
    query.requires_grad_(True)  # the forward+backward timing needs gradients through the default call
    out = default_route_fn(impl)(query, gain, sources, 1e-6)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert query.grad is not None and query.grad.shape == (8,)
