"""Check and time every routing path on a GPU: one verdict per variant and path, then what to switch.

For each routed variant and each path (reference, lean, triton where Triton runs):
  accuracy  the path's logits and gradients against a float64 run of the same weights, judged as
            tests/residual/test_fast_paths.py judges them: its error (L2 norm, per tensor) may be at
            most 2x the reference path's own error in the same precision, plus a floor of that
            precision's rounding (ROUNDING); in fp32 (TF32 off) and under bf16 autocast;
  time      a training step (forward and backward) against standard's, interleaved, median.
The last line says whether `routing_impl="auto"` may pick Triton on CUDA
(`attnres.routing.route.TRITON_IN_AUTO`). Runs on CPU too (`--device cpu --tiny`: the test of this
script), where the fused kernel takes Triton's place.

Usage: python tools/benchmarks/gpu_check.py [--device cuda] [--tiny] [--repeats 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from attnres import AttnResLM, ModelConfig
from attnres.routing.route import TRITON_IN_AUTO
from attnres.routing.triton_route import triton_available

VARIANTS = [("full_attnres", {}), ("block_attnres", {"num_blocks": 8}), ("delta_attnres", {}),
            ("delta_block", {"num_blocks": 8})]
ERROR_FACTOR = 2.0  # a path may be at most this much less accurate than the reference path
# A floor relative to each tensor's norm, for tensors the reference computes almost exactly: in fp32
# 2^-18 (64 units of rounding, as a sum of thousands of products can lose; on CPU the lean and fused
# paths come within 1.4x of the reference's own error at 2^-24), in bf16 one rounding (2^-9).
ROUNDING = {torch.float32: 2.0 ** -18, torch.bfloat16: 2.0 ** -9}


def shape(tiny: bool) -> tuple[dict, tuple[int, int]]:
    """(model fields, (batch, seq)) for the check: small on CPU, a 16 x 1024 model on a GPU."""
    if tiny:
        return dict(vocab_size=128, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                    intermediate_size=64, max_seq_len=64), (2, 32)
    return dict(vocab_size=32768, hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=8,
                intermediate_size=2816, max_seq_len=2048), (4, 1024)


def build(fields: dict, residual: str, options: dict, device: str) -> AttnResLM:
    """A model whose routing is not trivial: queries drawn from N(0, 1), key gains moved off one."""
    torch.manual_seed(0)
    model = AttnResLM(ModelConfig(**fields, residual=residual, residual_options=options)).to(device)
    with torch.no_grad():
        for router in model.routers:
            router.query.normal_()
            router.key_norm.weight.uniform_(0.5, 1.5)
    return model


def run(model: AttnResLM, ids: torch.Tensor, bf16: bool) -> dict[str, torch.Tensor]:
    """Logits and every gradient of one step, by name."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(ids, labels=ids)
    out.loss.backward()
    return {"logits": out.logits.detach(), **{n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


def worst_ratio(got: dict, reference: dict, truth: dict, rounding: float) -> float:
    """max over tensors of error(path) / (ERROR_FACTOR * error(reference) + rounding * |truth|): <= 1 passes."""
    ratios = []
    for name, value in truth.items():
        value = value.double()
        error = torch.linalg.vector_norm(got[name].double() - value).item()
        bound = ERROR_FACTOR * torch.linalg.vector_norm(reference[name].double() - value).item()
        ratios.append(error / (bound + rounding * torch.linalg.vector_norm(value).item() + 1e-300))
    return max(ratios)


def step_seconds(model: AttnResLM, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 4 x 32 model: the CPU test of this script")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model, interleaved")
    parser.add_argument("--out", help="write the verdicts as JSON here")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (or --device cpu --tiny to try the script)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
    fields, (batch, seq) = shape(args.tiny)
    ids = torch.randint(0, fields["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    fast = "triton" if args.device.startswith("cuda") else "fused"
    paths = ["reference", "lean"] + ([fast] if fast != "triton" or triton_available() else [])
    standard = build(fields, "standard", {}, args.device)
    rows, failed = [], []
    for residual, options in VARIANTS:
        truth = run(build(fields, residual, options, args.device).set_routing("reference").double(), ids, bf16=False)
        models = {path: build(fields, residual, options, args.device).set_routing(path) for path in paths}
        runs = {(p, bf16): run(models[p], ids, bf16) for p in paths for bf16 in (False, True)}
        times = {path: [] for path in ["standard", *paths]}
        for _ in range(args.repeats):  # interleaved, so a drift in clock or load falls on every path alike
            for path, model in [("standard", standard), *models.items()]:
                times[path].append(step_seconds(model, ids))
        base = statistics.median(times["standard"])
        for path in paths:
            ratios = {name: worst_ratio(runs[(path, bf16)], runs[("reference", bf16)], truth if not bf16 else
                                        runs[("reference", False)], ROUNDING[dtype])
                      for name, bf16, dtype in (("fp32", False, torch.float32), ("bf16", True, torch.bfloat16))}
            passed = all(r <= 1.0 for r in ratios.values())
            step = statistics.median(times[path]) / base
            rows.append({"variant": residual, "options": options, "path": path, "error_ratios": ratios,
                         "passed": passed, "step_vs_standard": step})
            if not passed:
                failed.append(f"{residual}/{path}")
            print(f"{residual:14s} {path:9s} fp32 {ratios['fp32']:.2f}  bf16 {ratios['bf16']:.2f} of the bound  "
                  f"step {step:.2f}x standard  {'PASS' if passed else 'FAIL'}", flush=True)
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"device": str(ids.device), "name": torch.cuda.get_device_name() if ids.is_cuda else "cpu",
                       "torch": torch.__version__, "rows": rows}, out, indent=1)
    if failed:
        print(f"gpu_check: FAILED {', '.join(failed)}; keep TRITON_IN_AUTO = False in src/attnres/routing/route.py")
        return 1
    if fast == "triton" and "triton" in paths and not TRITON_IN_AUTO:
        print("gpu_check: every path passed on this GPU; to let routing_impl 'auto' pick Triton on CUDA, set "
              "TRITON_IN_AUTO = True in src/attnres/routing/route.py and commit this output with it")
    else:
        print("gpu_check: every path passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
