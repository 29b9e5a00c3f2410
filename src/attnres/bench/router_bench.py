"""Router micro-benchmark: bytes/s of one routing call against a memory copy timed in the same run.

Routing is memory-bound (a few flops per element read), so the useful yardstick is the machine's
own copy bandwidth: a router that moves its minimal bytes at copy speed scores 1.0.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch

from attnres.bench.bench_config import BenchConfig
from attnres.train.timing import Task, run_interleaved
from attnres.routing import resolve_impl
from attnres.methods import Router
from attnres.train.step_cost import device_sync

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


class _BenchData:
    """The benchmark's tensors on config.device: n sources (router_batch, seq_len, hidden_size) in the
    precision's dtype, leaf copies that take gradients, query and key gain (D,), the output's gradient,
    and a copy pair as large as all sources together."""

    def __init__(self, config: BenchConfig) -> None:
        self.config, self.device = config, torch.device(config.device)
        self.dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
        self.shape = (config.router_batch, config.seq_len, config.hidden_size)
        self.n = config.router_sources
        device, generator = self.device, torch.Generator().manual_seed(config.seed)
        self.sources = [torch.randn(self.shape, generator=generator).to(device=device, dtype=self.dtype)
                        for _ in range(self.n)]
        self.grad_sources = [s.detach().clone().requires_grad_(True) for s in self.sources]
        self.query = (0.1 * torch.randn(self.shape[-1], generator=generator)).to(device)
        self.gain = torch.ones(self.shape[-1], device=device)
        self.grad_query, self.grad_gain = self.query.clone().requires_grad_(True), self.gain.clone().requires_grad_(True)
        self.grad_out = torch.randn(self.shape, generator=generator).to(device=device, dtype=self.dtype)
        self.copy_src = torch.randn(self.n * math.prod(self.shape), generator=generator).to(device=device,
                                                                                             dtype=self.dtype)
        self.copy_dst = torch.empty_like(self.copy_src)

    def describe(self) -> dict:
        """{"n_sources", "shape", "dtype", "device"} of the results."""
        return {"n_sources": self.n, "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device)}

    def route_tasks(self, route_fn: Callable, kwargs: dict, prefix: str = "") -> list[Task]:
        """Forward (no grad) and forward + backward of route_fn(query, gain, sources, EPS, **kwargs)."""
        def call(q, g, srcs):
            out = route_fn(q, g, srcs, EPS, **kwargs)
            return out[0] if isinstance(out, tuple) else out

        def forward():
            with torch.no_grad():
                call(self.query, self.gain, self.sources)

        def clear_grads():
            for t in (*self.grad_sources, self.grad_query, self.grad_gain):
                t.grad = None

        def forward_backward():
            call(self.grad_query, self.grad_gain, self.grad_sources).backward(self.grad_out)

        return [Task(prefix + "forward", forward), Task(prefix + "forward_backward", forward_backward, setup=clear_grads)]

    def time(self, tasks: list[Task], log: Callable[[str], object], what: str, more: str = "") -> tuple:
        """A copy (first) and `tasks` timed in the same interleaved rounds, after a line naming `what` is
        timed -> (timings by task name, the copy's {"bytes", "time", "bytes_per_s"})."""
        log(f"router: {what} over {self.n} sources of {tuple(self.shape)} {self.dtype} on {self.device}"
            f"{more}")
        copy = Task("copy", lambda: self.copy_dst.copy_(self.copy_src))
        timings = run_interleaved([copy, *tasks], self.config.repeats, self.config.warmup,
                                  sync=device_sync(self.device), log=log, label="router: ")
        moved = copy_bytes(self.copy_src.numel(), self.dtype)
        return timings, {"bytes": moved, "time": timings["copy"].to_dict(),
                         "bytes_per_s": moved / timings["copy"].median}

    def rates(self, timings: dict, copy: dict, prefix: str = "") -> dict:
        """{"forward" / "forward_backward": {"bytes", "time", "bytes_per_s", "fraction_of_copy"}}."""
        result = {}
        for name, backward in (("forward", False), ("forward_backward", True)):
            moved = router_bytes(self.n, self.shape, self.dtype, backward=backward)
            rate = moved["total_bytes"] / timings[prefix + name].median
            result[name] = {"bytes": moved, "time": timings[prefix + name].to_dict(), "bytes_per_s": rate,
                            "fraction_of_copy": rate / copy["bytes_per_s"]}
        return result


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
    route_fn = route_fn or default_route_fn(config.routing_impl)
    data = _BenchData(config)
    kwargs = {"impl": config.routing_impl} if "impl" in _parameters(route_fn) else {}
    uses_impl = bool(kwargs) or getattr(route_fn, "uses_routing_impl", False)
    timings, copy = data.time(data.route_tasks(route_fn, kwargs), log, function_name(route_fn))
    return {"function": function_name(route_fn), "routing_impl": config.routing_impl,
            "resolved_impl": resolve_impl(config.routing_impl, data.device) if uses_impl else None,
            **data.describe(), "copy": copy, **data.rates(timings, copy)}


def compare_router_impls(config: BenchConfig, impls: Sequence[str], log: Callable[[str], object] = print) -> dict:
    """The router micro-benchmark of `run_router_bench` for several routing implementations, timed in
    the same interleaved rounds (so a busy machine slows them alike) against one copy.

    impls: names from attnres.routing.IMPLS, each timed through the Router module as the models run it.
    Returns {"n_sources", "shape", "dtype", "device", "threads", "copy": {...}, "impls": {impl:
    {"resolved_impl", "forward": {...}, "forward_backward": {...}}}} with the fields of run_router_bench.
    """
    data = _BenchData(config)
    tasks = []
    for impl in impls:
        resolve_impl(impl, data.device)  # an unusable implementation fails before any timing
        tasks += data.route_tasks(default_route_fn(impl), {}, prefix=f"{impl}/")
    threads = torch.get_num_threads()
    timings, copy = data.time(tasks, log, ", ".join(impls), f", {threads} threads")
    return {**data.describe(), "threads": threads, "copy": copy,
            "impls": {impl: {"resolved_impl": resolve_impl(impl, data.device),
                             **data.rates(timings, copy, f"{impl}/")} for impl in impls}}


def format_comparison(result: dict) -> str:
    """compare_router_impls's result as a markdown table: time and share of the copy bandwidth."""
    lines = [f"{result['n_sources']} sources of {tuple(result['shape'])} {result['dtype']} on {result['device']}, "
             f"{result['threads']} threads; copy {result['copy']['bytes_per_s'] / 1e9:.1f} GB/s", "",
             "| routing_impl | forward ms | forward share | forward+backward ms | forward+backward share |",
             "|---|---:|---:|---:|---:|"]
    for impl, part in result["impls"].items():
        name = impl if part["resolved_impl"] == impl else f"{impl} ({part['resolved_impl']})"
        cells = [f"{part[k]['time']['median_s'] * 1e3:.1f} | {part[k]['fraction_of_copy']:.2f}"
                 for k in ("forward", "forward_backward")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _parameters(fn: Callable) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
