"""What routing costs in the compiled decode step: time per token against standard, per routing implementation.

Converted SmolLM2-135M (the models `generate_speed.py` converts and keeps in its cache folder), each
decoding through `FastGenerator(compile=True)`: standard, and Block and Full AttnRes with each
routing implementation asked for. Rounds interleave every model; medians of per-round ratios to
standard. The first call's time (compile included; a warm start where inductor's cache has the
graph) is recorded too.

    .venv/bin/python tools/benchmarks/generate_speed.py --out /tmp/g.json   # converts the models once
    .venv/bin/python tools/benchmarks/decode_routing.py --out results/decode-routing/smollm2-fp32.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnres.common.machine import machine_info
from attnres.generation import FastGenerator
from attnres.hf import AttnResForCausalLM

CACHE = Path.home() / ".cache" / "attnres" / "generate-speed"
MODELS = {"standard": "smollm2-standard", "block_attnres": "smollm2-block_attnres-6", "full_attnres": "smollm2-full_attnres"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", nargs="+", default=["fused", "lean"], choices=["fused", "lean"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per timed generation (default: 48)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = {"standard": ("standard", "auto")}
    cases.update({f"{variant} {impl}": (variant, impl) for variant in ("block_attnres", "full_attnres")
                  for impl in args.impls})
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    generators, first_call_s = {}, {}
    for name, (variant, impl) in cases.items():
        model = AttnResForCausalLM.from_pretrained(CACHE / MODELS[variant]).eval()
        model.set_routing(impl)
        generators[name] = FastGenerator(model.model, compile=True)
        begin = time.perf_counter()
        generators[name].generate(ids, max_new_tokens=4)
        first_call_s[name] = time.perf_counter() - begin
        print(f"{name}: first call {first_call_s[name]:.1f} s", flush=True)
    per_token = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, generator in generators.items():
            result = generator.generate(ids, max_new_tokens=args.tokens)
            per_token[name].append(result.decode_s / result.decode_steps)
    rows = {name: {"per_token_ms": 1e3 * statistics.median(times),
                   "x_standard": statistics.median(t / b for t, b in zip(times, per_token["standard"])),
                   "first_call_s": first_call_s[name], "samples_ms": [1e3 * t for t in times]}
            for name, times in per_token.items()}
    record = {"command": "tools/benchmarks/decode_routing.py " + " ".join(
                  f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                  for k, v in vars(args).items()),
              "machine": machine_info(torch.device("cpu")), "threads": args.threads, "tokens": args.tokens,
              "rounds": args.rounds, "torch": torch.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, row in rows.items():
        print(f"{name:22s} {row['per_token_ms']:7.2f} ms/token  x{row['x_standard']:.3f}  first call {row['first_call_s']:.0f} s")


if __name__ == "__main__":
    main()
