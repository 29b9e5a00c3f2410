"""Training-step cost of chunked two-phase routing: Full and Delta AttnRes with every router alone
(routing_chunk_size 1) and chunked (the automatic size), next to the block variants, as ratios to
`standard` measured in the same interleaved run (median of per-round ratios).

    .venv/bin/python tools/benchmarks/chunked_routing_cost.py                       # 24 x 256, seq 256
    .venv/bin/python tools/benchmarks/chunked_routing_cost.py --layers 48 --hidden 64 --seq-len 128
    .venv/bin/python tools/benchmarks/chunked_routing_cost.py --routing-impl lean   # phase 1 on the lean ops

The models and the timed step are `attnres.train.step_cost.VariantRunner`'s, the runner `attnres bench`
and `attnres compare` use; fp32, batch 1, vocabulary 4096, block variants with 8 blocks (or the nearest valid count).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from attnres.common.machine import machine_info
from attnres.residual import nearest_num_blocks
from attnres.train.timing import Task, run_interleaved
from attnres.model import ModelConfig
from attnres.train.step_cost import VariantRunner


def cases(num_layers: int) -> dict[str, tuple[dict, int | None]]:
    """Display name -> (ModelConfig fields, routing chunk size) of every measured model (block
    variants: the valid block count nearest 8)."""
    chunkable = {f"{residual} C={label}": (dict(residual=residual), chunk)
                 for residual in ("full_attnres", "delta_attnres") for label, chunk in (("1", 1), ("auto", None))}
    blocks = {name: (dict(residual=name, residual_options={"num_blocks": nearest_num_blocks(2 * num_layers, 8)}), None)
              for name in ("block_attnres", "delta_block")}
    return {"standard": ({}, None), **chunkable, **blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--routing-impl", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(vocab_size=4096, hidden_size=args.hidden, num_layers=args.layers,
                 num_heads=max(1, args.hidden // 64), num_kv_heads=max(1, args.hidden // 128),
                 intermediate_size=3 * args.hidden, max_seq_len=args.seq_len)
    batch = torch.randint(0, 4096, (1, args.seq_len), generator=torch.Generator().manual_seed(0))
    runners = {name: VariantRunner(ModelConfig(**shape, **fields), torch.device("cpu"), "fp32", batch, None, 0,
                                   args.routing_impl, chunk)
               for name, (fields, chunk) in cases(args.layers).items()}
    timings = run_interleaved([Task(name, runner.train_step) for name, runner in runners.items()],
                              repeats=args.repeats, warmup=args.warmup)
    machine = machine_info(torch.device("cpu"))
    print(f"{machine['device_name']}, {machine['cpu_capability']} kernels, native bf16: {machine['cpu_native_bf16']}; fp32, {args.threads} threads, {args.layers} x {args.hidden}, seq {args.seq_len}, "
          f"routing_impl={args.routing_impl}; {args.repeats} rounds after {args.warmup} warm-up")
    base = timings["standard"].samples
    for name, timing in timings.items():
        ratio = statistics.median(t / b for t, b in zip(timing.samples, base))
        print(f"{name:20s} {timing.median:7.3f} s  {ratio:5.2f}x  group size {runners[name].model.residual.group_size}")


if __name__ == "__main__":
    main()
