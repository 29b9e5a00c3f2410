#!/usr/bin/env bash
# The reproduction study (docs/explanation/study.md): `attnres compare --preset study` as SHARDS one-thread
# processes in parallel (default 2, one per core), then one call that writes the report, the
# block-count figure, and `attnres analyze` of seed 0 of the five main variants. Finished runs are reused, so an
# interrupted study continues where it stopped.
# Usage: tools/studies/study.sh [OUT (default results/study)] [SHARDS (default 2)] [--set train.steps=1000 ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
OUT="${1:-results/study}"
SHARDS="${2:-2}"
EXTRA=("${@:3}")
compare_in_shards study "$OUT" "$SHARDS" "${EXTRA[@]}"
python tools/benchmarks/study_figure.py "$OUT"
R="$OUT/runs"
attnres analyze "$R/standard/seed0" "$R/full_attnres/seed0" "$R/block_attnres-N-8/seed0" "$R/delta_attnres/seed0" \
  "$R/delta_block-N-8/seed0" --labels standard full_attnres "block_attnres (N=8)" delta_attnres "delta_block (N=8)" \
  --out "$OUT/analyze" --max-batches 4
