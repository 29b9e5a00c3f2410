#!/usr/bin/env bash
# The machine probe of the CPU scaling sweep (docs/explanation/scaling-results.md): the three smallest sizes of
# `attnres scaling --preset cpu`, seed 0, on another floating-point path (PyTorch's CPU kernels
# chosen by ATEN_CPU_CAPABILITY: avx2 on an AVX-512 machine, default, the scalar kernels, on an AVX2
# one), then tools/benchmarks/scaling_probe.py, which pairs them with the sweep's runs into OUT/probe.md.
# Usage: tools/studies/scaling_probe.sh [SWEEP (default results/scaling)] [OUT (default results/scaling-probe)] [CAPABILITY (default avx2)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
SWEEP="${1:-results/scaling}"
OUT="${2:-results/scaling-probe}"
ATEN_CPU_CAPABILITY="${3:-avx2}" OMP_NUM_THREADS=1 attnres scaling --preset cpu --sizes d32-l4 d48-l4 d64-l8 \
  --seeds 1 --out "$OUT"
python tools/benchmarks/scaling_probe.py "$SWEEP" "$OUT"
