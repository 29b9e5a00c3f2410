#!/usr/bin/env bash
# The machine probe of the ablation table (docs/explanation/ablation.md): the `ablation_probe` preset (the
# ablation's run; standard, Full AttnRes and Delta Block on 2 seeds) trained with PyTorch's scalar
# CPU kernels (ATEN_CPU_CAPABILITY=default), another floating-point path on the same machine. Its
# runs go to OUT (default results/ablation-probe); `python -m tools.pages` sets their paired
# differences beside the ablation's on the same seeds (docs/explanation/ablation.md).
# Usage: tools/studies/ablation_probe.sh [OUT] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
OUT="${1:-results/ablation-probe}"
mkdir -p "$OUT"
ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 attnres compare --preset ablation_probe --out "$OUT" "${@:2}"
