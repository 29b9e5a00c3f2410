#!/usr/bin/env bash
# The Kimi ablation table in direction (docs/ablation.md): `attnres compare --preset ablation` as
# SHARDS one-thread processes in parallel (default 2, one per core), then one call that writes the
# report (paired differences with 95 % intervals, the interleaved cost column, training stability),
# benchmarks/study_tables.py's tables, and `attnres analyze --causal` of seed 0 of the routed
# variants (the causal-routing summary). Finished runs are reused, so an interrupted study continues
# where it stopped.
# Usage: scripts/ablation.sh [OUT (default docs/ablation-study)] [SHARDS (default 2)] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
source "$ROOT/scripts/shards.sh"
cd "$ROOT"
OUT="${1:-docs/ablation-study}"
SHARDS="${2:-2}"
EXTRA=("${@:3}")
compare_in_shards ablation "$OUT" "$SHARDS" "${EXTRA[@]}"
python benchmarks/study_tables.py "$OUT"
R="$OUT/runs"
attnres analyze "$R/full_attnres/seed0" "$R/full_attnres-input-query/seed0" "$R/full_attnres-sigmoid/seed0" \
  "$R/block_attnres-N-8/seed0" "$R/delta_attnres/seed0" "$R/delta_block-N-8/seed0" "$R/mhc/seed0" \
  --labels full_attnres "full (input query)" "full (sigmoid)" "block_attnres (N=8)" delta_attnres \
  "delta_block (N=8)" mhc --out "$OUT/analyze" --max-batches 2 --causal
