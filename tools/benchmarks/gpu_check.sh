#!/usr/bin/env bash
# The one check of the GPU paths, for a GPU machine (not run in CI: no GPU there):
#   1. tools/benchmarks/gpu_check.py: every routed variant on every path (reference, lean, triton) against a
#      float64 run, fp32 and bf16 autocast, and its training step against standard's: one verdict per
#      path, and the line that says whether routing_impl "auto" may pick Triton (TRITON_IN_AUTO);
#   2. the routing tests on the GPU (the Triton kernel compiled, not interpreted);
#   3. `attnres bench --preset paper-gpu` (hidden 2048, 32 layers, seq 4096) with the lean op and the
#      Triton kernel, for the docs.
# Usage: tools/benchmarks/gpu_check.sh [OUT_DIR]      (OUT_DIR defaults to reports/gpu-check)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/reports/gpu-check}"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
status=0
python tools/benchmarks/gpu_check.py --out "$OUT/verdicts.json" 2>&1 | tee "$OUT/verdicts.txt" || status=1
TRITON_INTERPRET=0 python -m pytest -q tests/routing/test_triton_route.py tests/residual/test_fast_paths.py \
    tests/routing/test_lean.py 2>&1 | tee "$OUT/tests.txt" || status=1
attnres bench --preset paper-gpu --routing-impl lean --depths none --out "$OUT/bench-lean" 2>&1 | tail -n 40
attnres bench --preset paper-gpu --routing-impl triton --depths none --out "$OUT/bench-triton" 2>&1 | tail -n 40
exit "$status"
