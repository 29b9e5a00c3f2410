#!/usr/bin/env bash
# The paper's own setting at CPU scale (configs/compare/kimi_linear.yaml, docs/explanation/ablation.md):
# first the stability check on the Kimi Linear model (tools/studies/stability.sh with its preset), then
# `attnres compare --preset kimi_linear` as SHARDS one-thread processes and its report. Finished runs
# are reused. `python -m tools.pages` then writes the page's tables from the two folders.
# Usage: tools/studies/kimi_linear.sh [OUT (default results/kimi-linear)] [SHARDS (default 2)] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
OUT="${1:-results/kimi-linear}"
SHARDS="${2:-2}"
EXTRA=("${@:3}")
PRESET=kimi_linear_stability tools/studies/stability.sh "$OUT-stability" "$SHARDS" "${EXTRA[@]}"
compare_in_shards kimi_linear "$OUT" "$SHARDS" "${EXTRA[@]}"
