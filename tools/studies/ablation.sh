#!/usr/bin/env bash
# The Kimi ablation table in direction (docs/explanation/ablation.md): `attnres compare --preset ablation`
# as SHARDS one-thread processes in parallel (default 2, one per core), then one call that writes the
# report (paired differences with 95 % intervals, the interleaved cost column, training stability), and
# `attnres analyze --causal` of seed 0 of the routed variants and the stream variants (the
# causal-routing summary). Finished runs are reused, so an interrupted study continues where it stopped.
# `python -m tools.pages` then writes the page's tables from OUT (results/ablation by default).
# Usage: tools/studies/ablation.sh [OUT (default results/ablation)] [SHARDS (default 2)] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
OUT="${1:-results/ablation}"
SHARDS="${2:-2}"
EXTRA=("${@:3}")
compare_in_shards ablation "$OUT" "$SHARDS" "${EXTRA[@]}"
R="$OUT/runs"
# The causal check on four routers, one per quarter of depth (all 32 of them take about 10 minutes
# per model here): the sub-layer routers 7, 15, 23 and 31 exist in every routed variant.
attnres analyze "$R/full_attnres/seed0" "$R/full_attnres-input-query/seed0" "$R/full_attnres-sigmoid/seed0" \
  "$R/full_attnres-no-key-norm/seed0" "$R/block_attnres-N-8/seed0" "$R/delta_attnres/seed0" \
  "$R/delta_block-N-8/seed0" "$R/mhc/seed0" "$R/hyper_connections/seed0" \
  --labels full_attnres "full (input query)" "full (sigmoid)" "full (no key norm)" "block_attnres (N=8)" \
  delta_attnres "delta_block (N=8)" mhc hyper_connections --out "$OUT/analyze" --max-batches 2 \
  --causal-routers 7 15 23 31
