#!/usr/bin/env bash
# The CUDA checks of the fast-routing issue, as one script for a GPU machine (not run in CI):
#   1. the compiled Triton kernel and the lean op against the reference, fp32 and bf16 (pytest);
#   2. `attnres bench --preset paper-gpu` (hidden 2048, 32 layers, seq 4096) with the Triton kernel
#      (routing_impl auto picks it on CUDA) and with the lean op, for the docs.
# Usage: benchmarks/gpu_check.sh [OUT_DIR]      (OUT_DIR defaults to reports/gpu-check)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/reports/gpu-check}"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
TRITON_INTERPRET=0 python -m pytest -q tests/routing/test_triton_route.py tests/residual/test_fast_paths.py \
    tests/routing/test_lean.py 2>&1 | tee "$OUT/tests.txt"
attnres bench --preset paper-gpu --depths none --out "$OUT/bench-triton" 2>&1 | tail -n 40
attnres bench --preset paper-gpu --routing-impl lean --depths none --out "$OUT/bench-lean" 2>&1 | tail -n 40
