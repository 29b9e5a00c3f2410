"""What a mixture-of-experts feed-forward costs on CPU against the dense SwiGLU of equal active parameters.

Three ways to compute one feed-forward sub-layer of the same active size, forward and backward on
(batch x seq) tokens:
  dense          a SwiGLU of width (k + shared) x expert_size: the dense model of equal active parameters
  attnres moe    attnres.model.MixtureOfExperts: tokens sorted by expert, one matrix product per expert
  transformers   transformers' KimiLinearMoE with its eager experts (a one-hot mask per expert), the
                 same router and weights
Rounds interleave the three (machine drift hits all alike); medians over rounds, and each ratio is
the median of per-round ratios to dense.

    .venv/bin/python tools/benchmarks/moe_dispatch.py --out results/moe-dispatch/moe_dispatch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from attnres.common.machine import machine_info
from attnres.model.mlp import MLP
from attnres.model.moe import MixtureOfExperts, MoEConfig


def timed(module: torch.nn.Module, x: torch.Tensor) -> float:
    """Seconds of one forward and backward of `module` on x."""
    x = x.detach().requires_grad_()
    begin = time.perf_counter()
    module(x).square().mean().backward()
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-size", type=int, default=256)
    parser.add_argument("--shared", type=int, default=1)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2048], help="batch x seq tokens per call")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = MoEConfig(num_experts=args.experts, experts_per_token=args.top_k, expert_size=args.expert_size,
                       shared_experts=args.shared, scoring="sigmoid", score_bias=True)
    ours = MixtureOfExperts(args.hidden, config)
    ours.reset_parameters(0.02)
    dense = MLP(args.hidden, (args.top_k + args.shared) * args.expert_size)
    modules = {"dense": dense, "attnres moe": ours}
    try:
        import transformers
        from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearMoE

        reference = KimiLinearMoE(transformers.KimiLinearConfig(
            hidden_size=args.hidden, moe_intermediate_size=args.expert_size, num_local_experts=args.experts,
            num_experts_per_tok=args.top_k, n_shared_experts=args.shared, n_group=1, topk_group=1,
            experts_implementation="eager"))
        theirs = reference.state_dict()
        theirs.update({"gate.weight": ours.gate.weight.detach(), "experts.gate_up_proj": ours.experts.gate_up_proj.detach(),
                       "experts.down_proj": ours.experts.down_proj.detach()})
        reference.load_state_dict(theirs)
        modules["transformers"] = reference
    except ImportError:
        pass
    results = {}
    for tokens in args.tokens:
        x = torch.randn(1, tokens, args.hidden)
        samples = {name: [] for name in modules}
        for round_index in range(args.rounds + 1):  # round 0: warm-up
            for name, module in modules.items():
                seconds = timed(module, x)
                if round_index:
                    samples[name].append(seconds)
        base = samples["dense"]
        results[str(tokens)] = {name: {"median_s": statistics.median(s), "samples_s": s,
                                       "ratio_to_dense": statistics.median(a / b for a, b in zip(s, base))}
                                for name, s in samples.items()}
        print(f"{tokens} tokens: " + ", ".join(f"{name} {1e3 * r['median_s']:.2f} ms ({r['ratio_to_dense']:.2f}x)"
                                               for name, r in results[str(tokens)].items()), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        report = {"command": "python tools/benchmarks/moe_dispatch.py " + " ".join(sys.argv[1:]),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_info(torch.device("cpu")),
                  "settings": {k: v for k, v in vars(args).items() if k != "out"}, "results": results}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
