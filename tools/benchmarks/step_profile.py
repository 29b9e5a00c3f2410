"""Where a routed variant's training step spends the time standard's does not: the torch profiler's
self time per step, the fused routing kernels' by kind, and the rest of the difference.

Every variant and standard run in turn (one unprofiled step, then a profiled one) for --repeats
rounds; the figures are means over the rounds. Profiled time includes the profiler's own cost,
which falls on every op alike.

    .venv/bin/python tools/benchmarks/step_profile.py --precision bf16 --out results/step-profile/bf16.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from attnres.common.machine import machine_info
from attnres.model import ModelConfig
from attnres.routing import resolve_impl
from attnres.train.step_cost import VariantRunner

VARIANTS = ("block_attnres", "delta_block", "full_attnres", "delta_attnres")
# The extension's ops and their C++ autograd nodes (route_cpu.cpp), by what they do.
KINDS = (("route backward", "RouteFunction"), ("merge backward", "MergeFunction"), ("collect", "CollectFunction"),
         ("route forward", "attnres_fused_cpu::route"), ("merge forward", "attnres_fused_cpu::merge"),
         ("collect", "attnres_fused_cpu::collect"))


def kind(op: str) -> str | None:
    """The routing kernel an op name belongs to, or None for any other op."""
    return next((name for name, marker in KINDS if marker in op), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(vocab_size=4096, hidden_size=args.hidden, num_layers=args.layers, num_heads=max(1, args.hidden // 64),
                 num_kv_heads=max(1, args.hidden // 128), intermediate_size=args.hidden * 688 // 256,
                 max_seq_len=args.seq_len)
    options = {"block_attnres": {"num_blocks": 8}, "delta_block": {"num_blocks": 8}}
    batch = torch.randint(0, 4096, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    runners = {name: VariantRunner(ModelConfig(**shape, residual=name, residual_options=options.get(name)),
                                   torch.device("cpu"), args.precision, batch, None, 0)
               for name in ("standard", *VARIANTS)}
    self_ms = {name: Counter() for name in runners}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            runner.train_step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runner.train_step()
            for event in prof.key_averages():
                self_ms[name][event.key] += event.self_cpu_time_total / 1e3 / args.repeats
    base = sum(self_ms["standard"].values())
    rows = {}
    for name in VARIANTS:
        ops = self_ms[name]
        kinds = Counter()
        for op, ms in ops.items():
            if kind(op):
                kinds[kind(op)] += ms
        total = sum(ops.values())
        others = Counter({op: ms - self_ms["standard"][op] for op, ms in ops.items() if not kind(op)})
        rows[name] = {"step_ms": total, "x_standard": total / base, "extra_ms": total - base,
                      "routing_kernels_ms": dict(kinds), "rest_ms": total - base - sum(kinds.values()),
                      "largest_other_differences_ms": dict(others.most_common(5))}
    record = {"command": "tools/benchmarks/step_profile.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(torch.device("cpu")),
              "code_path": {"precision": args.precision, "routing_impl": "auto",
                            "routing": resolve_impl("auto", torch.device("cpu"))}, "threads": args.threads,
              "repeats": args.repeats, "shape": {"num_layers": args.layers, "hidden_size": args.hidden,
                                                 "batch_size": args.batch_size, "seq_len": args.seq_len},
              "standard_step_ms": base, "variants": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"standard {base:.0f} ms per profiled step")
    for name, row in rows.items():
        kernels = ", ".join(f"{k} {v:.1f}" for k, v in sorted(row["routing_kernels_ms"].items()))
        print(f"  {name:14s} {row['x_standard']:.3f}x (+{row['extra_ms']:.0f} ms): {kernels}; rest {row['rest_ms']:+.1f}")


if __name__ == "__main__":
    main()
