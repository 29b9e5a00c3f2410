"""Compiled decoding per token: which routing code the step should contain, and what its guards cost.

Each model decodes through `FastGenerator` (the static cache and the compiled step, inductor's Python
wrapper, FastGenerator's default on CPU, or with --cpp-wrapper its C++ wrapper) with routing_impl
"lean" (plain PyTorch that inductor fuses)
and "fused" (direct calls of the C++ kernels), for standard, Block AttnRes and Full AttnRes. Every
step is timed twice per round: with every guard evaluated at each call (what a plain compiled
function does), and as a generation runs it (all guards at its first step, then only those that tell
compiled graphs apart: `Decoding._guards`). Rounds interleave every model; medians of per-round ratios
to standard with the same guard setting.

    .venv/bin/python tools/benchmarks/compiled_decode_paths.py                 # 24 x 256, 2 threads
    .venv/bin/python tools/benchmarks/compiled_decode_paths.py --layers 4 --rounds 5
    .venv/bin/python tools/benchmarks/compiled_decode_paths.py --cpp-wrapper --impls fused   # the C++ wrapper
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections import defaultdict

import torch

from attnres.residual import nearest_num_blocks
from attnres.common.machine import machine_info
from attnres.generation import FastGenerator
from attnres.model import AttnResLM, ModelConfig
from attnres.generation.fast_generator import Decoding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per timing (default: 10)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--impls", nargs="+", default=["lean", "fused"], choices=["lean", "fused"])
    parser.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper (compiles 2-3x longer)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    blocks = nearest_num_blocks(2 * args.layers, 8)
    cases = {"standard": ({}, "auto")}
    for impl in args.impls:
        cases[f"block_attnres {impl}"] = (dict(residual="block_attnres", residual_options={"num_blocks": blocks}), impl)
        cases[f"full_attnres {impl}"] = (dict(residual="full_attnres"), impl)
    decodings, compile_s = {}, {}
    capacity = args.prompt + 2 * args.rounds * args.steps + 8
    for name, (fields, impl) in cases.items():
        torch.manual_seed(0)
        model = AttnResLM(ModelConfig(vocab_size=4096, hidden_size=args.hidden, num_layers=args.layers,
                                      num_heads=max(1, args.hidden // 64), num_kv_heads=max(1, args.hidden // 128),
                                      intermediate_size=3 * args.hidden, max_seq_len=capacity + 64, **fields))
        model = model.set_routing(impl).eval()
        generator = FastGenerator(model, options={"cpp_wrapper": args.cpp_wrapper})
        decoding = generator.start(torch.randint(0, 4096, (1, args.prompt)), max_new_tokens=capacity - args.prompt)
        begin = time.perf_counter()
        decoding.step()  # compiles
        compile_s[name] = time.perf_counter() - begin
        decodings[name] = decoding
        print(f"{name}: compiled in {compile_s[name]:.0f} s", flush=True)

    every_guard = contextlib.nullcontext
    times = defaultdict(list)
    for _ in range(args.rounds):
        for name, decoding in decodings.items():
            for guards, patch in (("all guards", True), ("as generated", False)):
                original = Decoding._guards
                if patch:
                    Decoding._guards = lambda self: every_guard()
                try:
                    begin = time.perf_counter()
                    for _ in range(args.steps):
                        decoding.step()
                    times[name, guards].append((time.perf_counter() - begin) / args.steps)
                finally:
                    Decoding._guards = original
    machine = machine_info(torch.device("cpu"))
    print(f"{machine['device_name']}, {machine['cpu_capability']} kernels, native bf16: {machine['cpu_native_bf16']}; "
          f"fp32, {args.threads} threads, {args.layers} x {args.hidden}, prompt {args.prompt}; {args.rounds} rounds "
          f"of {args.steps} steps; block_attnres with {blocks} blocks; inductor's "
          f"{'C++' if args.cpp_wrapper else 'Python'} wrapper")
    print(f"{'model':22s} {'guards':13s} {'ms/token':>9s} {'x standard':>10s} {'compile s':>9s}")
    for name in decodings:
        for guards in ("all guards", "as generated"):
            samples, base = times[name, guards], times["standard", guards]
            ratio = statistics.median(t / b for t, b in zip(samples, base))
            print(f"{name:22s} {guards:13s} {statistics.median(samples) * 1e3:9.2f} {ratio:10.3f} "
                  f"{compile_s[name]:9.0f}")
    saved = statistics.median(a / b for a, b in zip(times["standard", "as generated"], times["standard", "all guards"]))
    print(f"standard, as generated / all guards: {saved:.3f}")


if __name__ == "__main__":
    main()
