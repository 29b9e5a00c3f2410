"""`python -m attnres.bench.router_compare`: the router micro-benchmark for several routing implementations.

One interleaved run (`compare_router_impls`) times a copy and each implementation's forward and
forward + backward through the Router module, and prints a markdown table of times and shares of
the copy bandwidth. A module of its own, so that `python -m` does not run a module the bench
package has already imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from attnres.bench.bench_config import resolve_config
from attnres.bench.router_bench import compare_router_impls, format_comparison


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m attnres.bench.router_compare`: the router micro-benchmark for several implementations."""
    parser = argparse.ArgumentParser(prog="python -m attnres.bench.router_compare", description=(
        "Router micro-benchmark: each implementation's forward and forward+backward against a copy, interleaved."))
    parser.add_argument("--impls", default="lean,fused", help="comma-separated routing_impl names (default lean,fused)")
    parser.add_argument("--precision", default="fp32", help="fp32 or bf16 (the sources' dtype)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (at least 5)")
    parser.add_argument("--warmup", type=int, default=2, help="discarded rounds first")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    config = resolve_config(precision=args.precision, repeats=args.repeats, warmup=args.warmup, device=args.device,
                            threads=args.threads)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    impls = [name.strip() for name in args.impls.split(",") if name.strip()]
    print(format_comparison(compare_router_impls(config, impls, log=lambda line: None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
