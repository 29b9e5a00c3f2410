"""Where a routed variant's training step spends its time beyond standard's: forward and backward
timed separately (interleaved medians), then the ops whose self time differs most (torch.profiler).

With --tiny the model keeps its depth but is 16 wide on 4 tokens, so the arithmetic vanishes and
what remains is the size-independent cost: Python, dispatch and autograd nodes per sub-layer.

    .venv/bin/python tools/benchmarks/step_overhead.py --variant block_attnres          # 24 x 256, seq 256
    .venv/bin/python tools/benchmarks/step_overhead.py --variant block_attnres --tiny
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from attnres.model import ModelConfig
from attnres.residual import VARIANTS, nearest_num_blocks
from attnres.train.step_cost import VariantRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="block_attnres", choices=[v for v in VARIANTS if v != "standard"])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--tiny", action="store_true", help="16 wide, 4 tokens: the size-independent cost")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--top", type=int, default=15, help="ops listed (default: 15)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hidden, tokens = (16, 4) if args.tiny else (256, 256)
    shape = dict(vocab_size=64 if args.tiny else 4096, hidden_size=hidden, num_layers=args.layers,
                 num_heads=max(1, hidden // 64), num_kv_heads=max(1, hidden // 128), intermediate_size=3 * hidden,
                 max_seq_len=256)
    fields = dict(residual=args.variant)
    if VARIANTS[args.variant].uses_blocks:
        fields["residual_options"] = {"num_blocks": nearest_num_blocks(2 * args.layers, 8)}
    batch = torch.randint(0, shape["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    runners = {name: VariantRunner(ModelConfig(**shape, **f), torch.device("cpu"), "fp32", batch, None, 0)
               for name, f in (("standard", {}), (args.variant, fields))}

    phases = {name: {"forward": [], "backward": [], "step": []} for name in runners}
    for round_ in range(args.rounds + 2):
        for name, runner in runners.items():
            runner.optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss = runner.model(batch, labels=batch).loss
            middle = time.perf_counter()
            loss.backward()
            end = time.perf_counter()
            runner.optimizer.step()
            stepped = time.perf_counter()
            if round_ >= 2:
                for phase, seconds in (("forward", middle - start), ("backward", end - middle), ("step", stepped - end)):
                    phases[name][phase].append(seconds)
    print(f"{args.variant} against standard, {args.layers} x {hidden}, {tokens} tokens, fp32, {args.threads} threads, "
          f"{args.rounds} interleaved rounds (medians)")
    for phase in ("forward", "backward", "step"):
        base, other = (statistics.median(phases[n][phase]) for n in runners)
        print(f"  {phase:8s} standard {base * 1e3:7.1f} ms  {args.variant} {other * 1e3:7.1f} ms  "
              f"{(other - base) * 1e3:+6.1f} ms  {other / base:.3f}x")

    self_ms, calls = {name: Counter() for name in runners}, {name: Counter() for name in runners}
    repeats = 4
    for _ in range(repeats):
        for name, runner in runners.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runner.train_step()
            for event in prof.key_averages():
                self_ms[name][event.key] += event.self_cpu_time_total / 1e3 / repeats
                calls[name][event.key] += event.count / repeats
    base, other = self_ms["standard"], self_ms[args.variant]
    print(f"profiled self time per step (profiler overhead included): standard {sum(base.values()):.1f} ms, "
          f"{args.variant} {sum(other.values()):.1f} ms; largest differences:")
    for key in sorted(set(base) | set(other), key=lambda k: -(other[k] - base[k]))[:args.top]:
        print(f"  {other[key] - base[key]:+7.2f} ms  calls {calls['standard'][key]:5.0f} -> "
              f"{calls[args.variant][key]:5.0f}  {key[:80]}")


if __name__ == "__main__":
    main()
