#!/usr/bin/env bash
# The reproduction study (docs/study.md): `attnres compare --preset study` as SHARDS one-thread
# processes in parallel (default 2, one per core), then one call that writes the report, then the
# study tables. Finished runs are reused, so an interrupted study continues where it stopped.
# Usage: scripts/study.sh [OUT (default docs/study)] [SHARDS (default 2)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
OUT="${1:-docs/study}"
SHARDS="${2:-2}"
mkdir -p "$OUT"
pids=()
for ((i = 0; i < SHARDS; i++)); do
  OMP_NUM_THREADS=1 attnres compare --preset study --out "$OUT" --shard "$i/$SHARDS" > "$OUT/shard$i.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
attnres compare --preset study --out "$OUT"
python benchmarks/study_tables.py "$OUT"
