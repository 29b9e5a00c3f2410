#!/usr/bin/env bash
# The stability check before the ablation study (docs/explanation/ablation.md): `attnres compare
# --preset stability` (standard and hyper-connections, 2 seeds) over a learning-rate x warm-up grid,
# each setting as SHARDS one-thread processes; `python -m tools.pages` then tabulates the final
# validation losses and the divergence events of every run. Finished runs are reused.
# Usage: tools/studies/stability.sh [OUT (default results/stability)] [SHARDS (default 2)] [--set ... passed on]
# PRESET=NAME checks another model (default: stability, the dense ablation's; kimi_linear_stability).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
OUT="${1:-results/stability}"
SHARDS="${2:-2}"
EXTRA=("${@:3}")
LRS=(1.0e-3 3.0e-3 6.0e-3)
WARMUPS=(10 60)
mkdir -p "$OUT"
for lr in "${LRS[@]}"; do
  for warmup in "${WARMUPS[@]}"; do
    dir="$OUT/lr$lr-warmup$warmup"
    min_lr=$(python -c "print($lr / 10)")
    settings=(--set "train.lr=$lr" --set "train.min_lr=$min_lr" --set "train.warmup_steps=$warmup" "${EXTRA[@]}")
    compare_in_shards "${PRESET:-stability}" "$dir" "$SHARDS" "${settings[@]}" > "$OUT/lr$lr-warmup$warmup.log" 2>&1
  done
done
