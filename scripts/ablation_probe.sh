#!/usr/bin/env bash
# The machine probe of the ablation table (docs/ablation.md): the `ablation_probe` preset (the
# ablation's run; standard, Full AttnRes and Delta Block on 2 seeds) trained with PyTorch's scalar
# CPU kernels (ATEN_CPU_CAPABILITY=default), another floating-point path on the same machine. Its
# runs go to OUT (default docs/ablation-probe); compare their paired differences against the
# ablation study's on the same seeds with benchmarks/ablation_table.py --probe OUT.
# Usage: scripts/ablation_probe.sh [OUT] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
OUT="${1:-docs/ablation-probe}"
mkdir -p "$OUT"
ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 attnres compare --preset ablation_probe --out "$OUT" "${@:2}"
