"""Router micro-benchmark: bytes/s of one routing call against a memory copy timed in the same run.

Routing is memory-bound (a few flops per element read), so the useful yardstick is the machine's
own copy bandwidth: a router that moves its minimal bytes at copy speed scores 1.0.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch

from attnres.bench.config import BenchConfig
from attnres.common.timing import Task, run_interleaved
from attnres.routing import Router, resolve_impl
from attnres.train.cost import device_sync

EPS = 1e-6


def default_route_fn(routing_impl: str = "auto") -> Callable:
    """The routing call to time, as fn(query (D,), key_gain (D,), sources: n x (B, T, D), eps) ->
    (mixed (B, T, D), weights): the Router module's forward with impl=routing_impl (what the models
    run), called through torch.func.functional_call so query and key_gain are the inputs."""
    routers: dict = {}

    def route_with_router(query, key_gain, sources, eps):
        key = (query.shape[0], eps, query.device)
        if key not in routers:
            routers[key] = Router(query.shape[0], eps).to(query.device)
        return torch.func.functional_call(routers[key], {"query": query, "key_norm.weight": key_gain},
                                          (list(sources),), {"impl": routing_impl})

    route_with_router.bench_name = f"attnres.routing.Router.forward(impl={routing_impl!r})"
    route_with_router.uses_routing_impl = True
    return route_with_router


def function_name(fn: Callable) -> str:
    """'module.qualname' of a function (or its `bench_name`), for the report."""
    if hasattr(fn, "bench_name"):
        return fn.bench_name
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def router_bytes(n_sources: int, shape: Sequence[int], dtype: torch.dtype, backward: bool = False) -> dict:
    """Minimal bytes one router call must move, for n sources of `shape` (B, T, D) in `dtype`.

    Forward: read every source once, write the (B, T, D) output. Forward + backward adds: read every
    source again and the output's gradient, write every source's gradient. The (B, T, n) weights and
    the (D,) parameters are ignored (small against D-wide tensors). Returns {"read_bytes",
    "written_bytes", "total_bytes"}.
    """
    tensor = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    read, written = n_sources * tensor, tensor
    if backward:
        read += n_sources * tensor + tensor
        written += n_sources * tensor
    return {"read_bytes": read, "written_bytes": written, "total_bytes": read + written}


def copy_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes moved by dst.copy_(src) of `numel` elements: one read plus one write."""
    return 2 * numel * torch.empty((), dtype=dtype).element_size()


def run_router_bench(config: BenchConfig, route_fn: Callable | None = None,
                     log: Callable[[str], object] = print) -> dict:
    """Time route_fn(query, key_gain, sources, eps) forward (no grad) and forward + backward, and a copy.

    route_fn: default `default_route_fn(config.routing_impl)`; a function with an `impl` parameter
    gets impl=config.routing_impl. Sources: config.router_sources tensors (router_batch, seq_len,
    hidden_size) in bf16 or fp32 per config.precision. The copy moves a tensor as large as all
    sources together. Returns {"function", "routing_impl", "resolved_impl" (None when route_fn
    ignores routing_impl), "n_sources", "shape", "dtype", "device", "copy": {"bytes", "time",
    "bytes_per_s"}, "forward" / "forward_backward": {"bytes": router_bytes(...), "time",
    "bytes_per_s", "fraction_of_copy"}}; times are {"median_s", "samples_s"}.
    """
    device = torch.device(config.device)
    route_fn = route_fn or default_route_fn(config.routing_impl)
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    shape = (config.router_batch, config.seq_len, config.hidden_size)
    n = config.router_sources
    generator = torch.Generator().manual_seed(config.seed)
    sources = [torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for _ in range(n)]
    grad_sources = [s.detach().clone().requires_grad_(True) for s in sources]
    query = (0.1 * torch.randn(shape[-1], generator=generator)).to(device)
    gain = torch.ones(shape[-1], device=device)
    grad_query, grad_gain = query.clone().requires_grad_(True), gain.clone().requires_grad_(True)
    grad_out = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    kwargs = {"impl": config.routing_impl} if "impl" in _parameters(route_fn) else {}
    uses_impl = bool(kwargs) or getattr(route_fn, "uses_routing_impl", False)

    def call(q, g, srcs):
        out = route_fn(q, g, srcs, EPS, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def forward():
        with torch.no_grad():
            call(query, gain, sources)

    def clear_grads():
        for t in (*grad_sources, grad_query, grad_gain):
            t.grad = None

    def forward_backward():
        call(grad_query, grad_gain, grad_sources).backward(grad_out)

    copy_src = torch.randn(n * math.prod(shape), generator=generator).to(device=device, dtype=dtype)
    copy_dst = torch.empty_like(copy_src)
    tasks = [Task("copy", lambda: copy_dst.copy_(copy_src)), Task("forward", forward),
             Task("forward_backward", forward_backward, setup=clear_grads)]
    log(f"router: {function_name(route_fn)} over {n} sources of {tuple(shape)} {dtype} on {device}")
    timings = run_interleaved(tasks, config.repeats, config.warmup, sync=device_sync(device), log=log,
                              label="router: ")
    copy_total = copy_bytes(copy_src.numel(), dtype)
    copy_rate = copy_total / timings["copy"].median
    result = {"function": function_name(route_fn), "routing_impl": config.routing_impl,
              "resolved_impl": resolve_impl(config.routing_impl, device) if uses_impl else None,
              "n_sources": n, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "device": str(device),
              "copy": {"bytes": copy_total, "time": timings["copy"].to_dict(), "bytes_per_s": copy_rate}}
    for name, backward in (("forward", False), ("forward_backward", True)):
        moved = router_bytes(n, shape, dtype, backward=backward)
        rate = moved["total_bytes"] / timings[name].median
        result[name] = {"bytes": moved, "time": timings[name].to_dict(), "bytes_per_s": rate,
                        "fraction_of_copy": rate / copy_rate}
    return result


def _parameters(fn: Callable) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
