"""What the drop-in's protocol checks (`ResidualScheme.start`, `sublayer_input`, `after`, `finish`) cost
in a training step: each variant's step with the checks, against the same model with the public calls
bound straight to the unchecked `_start`, `_sublayer_input`, `_after` and `_finish` (issue 59, item 6).

Both models share weights and batch; steps alternate, checked then unchecked, and the ratio of medians is
reported, with the CPU, its ATen kernel level and whether bf16 is native. Run it on an idle machine:

    .venv/bin/python tools/benchmarks/drop_in_checks.py --out results/drop-in-checks
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnres.common.atomic import write_atomic
from attnres.common.machine import cpu_facts, machine_info
from attnres.model import ModelConfig
from attnres.residual import VARIANTS, nearest_num_blocks
from attnres.train.step_cost import VariantRunner


def unchecked(scheme) -> None:
    """Bind `scheme`'s public calls to its unchecked implementations (this instance only)."""
    def start(embedding, record_routing=False):
        state = scheme._start(embedding, record_routing)
        state.next_sublayer, state.input_read = 0, False
        return state

    scheme.start = start
    scheme.sublayer_input = scheme._sublayer_input
    scheme.after = lambda s, state, delta: scheme._after(s, state, delta)
    scheme.finish = scheme._finish


def step_seconds(runner: VariantRunner, batch: torch.Tensor) -> float:
    runner.optimizer.zero_grad(set_to_none=True)
    start = time.perf_counter()
    runner.model(batch, labels=batch).loss.backward()
    runner.optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["standard", "block_attnres", "hyper_connections"])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(vocab_size=4096, hidden_size=args.hidden, num_layers=args.layers, num_heads=max(1, args.hidden // 64),
                 num_kv_heads=max(1, args.hidden // 128), intermediate_size=3 * args.hidden, max_seq_len=args.seq_len)
    batch = torch.randint(0, shape["vocab_size"], (1, args.seq_len), generator=torch.Generator().manual_seed(0))
    rows = []
    for variant in args.variants:
        fields = {"residual": variant}
        if VARIANTS[variant].uses_blocks:
            fields["residual_options"] = {"num_blocks": nearest_num_blocks(2 * args.layers, 8)}
        config = ModelConfig(**shape, **fields)
        checked = VariantRunner(config, torch.device("cpu"), "fp32", batch, None, 0)
        plain = VariantRunner(config, torch.device("cpu"), "fp32", batch, None, 0)
        plain.model.load_state_dict(checked.model.state_dict())
        unchecked(plain.model.residual)
        times = {"checked": [], "unchecked": []}
        for round_ in range(args.rounds + 2):
            for name, runner in (("checked", checked), ("unchecked", plain)):
                seconds = step_seconds(runner, batch)
                if round_ >= 2:  # two warm-up rounds
                    times[name].append(seconds)
        medians = {name: statistics.median(values) for name, values in times.items()}
        rows.append({"variant": variant, "checked_ms": medians["checked"] * 1e3,
                     "unchecked_ms": medians["unchecked"] * 1e3, "ratio": medians["checked"] / medians["unchecked"]})
        print(f"{variant:18s} checked {rows[-1]['checked_ms']:8.1f} ms  unchecked {rows[-1]['unchecked_ms']:8.1f} ms  "
              f"{rows[-1]['ratio']:.3f}x")
    machine = machine_info(torch.device("cpu"))
    print("; ".join(cpu_facts(machine)))
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "results.json", json.dumps({
        "command": "python tools/benchmarks/drop_in_checks.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()),
        "machine": machine, "settings": {"layers": args.layers, "hidden": args.hidden, "seq_len": args.seq_len,
                                         "batch": 1, "precision": "fp32", "threads": args.threads,
                                         "rounds": args.rounds},
        "rows": rows}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
