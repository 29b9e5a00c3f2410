"""run_bench: the three benchmarks in order, machine details, and the report files."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnres.bench.bench_config import BenchConfig
from attnres.bench.model_bench import run_depth_sweep, run_model_bench
from attnres.bench.report import write_report
from attnres.bench.router_bench import run_router_bench
from attnres.common.machine import check_device, machine_info
from attnres.generation.memory_bandwidth import read_bandwidth
from attnres.routing import resolve_impl


def run_bench(config: BenchConfig, out_dir: str | Path | None = None, command: str = "",
              route_fn: Callable | None = None, log: Callable[[str], object] = print) -> dict:
    """Run the model comparison, the depth sweep (if config.depths) and the router micro-benchmark.

    Returns the results dict (what bench.json holds); with `out_dir`, writes bench.json and bench.md there.
    route_fn: the routing function the micro-benchmark times (default: attnres.routing.route, else
    route_reference).
    """
    device = check_device(config.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    resolve_impl(config.routing_impl, device)  # an unusable impl fails now, not after the model runs
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        results = _run(config, device, command, route_fn, log)
    finally:
        torch.set_num_threads(threads)
    if out_dir is not None:
        write_report(results, out_dir)
    return results


def _run(config: BenchConfig, device: torch.device, command: str, route_fn: Callable | None,
         log: Callable[[str], object]) -> dict:
    machine = machine_info(device)
    notes = []
    if device.type == "cpu" and config.precision == "bf16" and machine["cpu_native_bf16"] is False:
        notes.append("This CPU has no native bf16 arithmetic (no avx512_bf16 / amx_bf16): bf16 matrix products "
                     "are emulated and much slower than fp32, so absolute times are slow and the ratios weigh "
                     "matrix products more than a bf16-capable machine would. `--precision fp32` runs faster here.")
    if device.type == "cpu":  # the limit decoding's memory traffic is compared with (bench.md)
        machine["read_bandwidth_gb_s"] = read_bandwidth().gb_s
    models = run_model_bench(config, log=log)
    sweep = run_depth_sweep(config, log=log) if config.depths else []
    router = run_router_bench(config, route_fn=route_fn, log=log)
    return {
        "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "config": config.to_dict(),
        "resolved_routing_impl": resolve_impl(config.routing_impl, device),
        "notes": notes,
        "models": models,
        "depth_sweep": sweep,
        "router": router,
    }
