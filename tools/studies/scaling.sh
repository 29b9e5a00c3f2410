#!/usr/bin/env bash
# The CPU scaling sweep (docs/explanation/scaling-results.md): `attnres scaling --preset cpu` as SHARDS one-thread
# processes in parallel (default 2, one per core; runs split by FLOPs so they end together), then one
# call that reuses every finished run, fits the laws and writes the report. Finished runs are reused,
# so an interrupted sweep continues where it stopped.
# Usage: tools/studies/scaling.sh [OUT (default results/scaling)] [SHARDS (default 2)] [--set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
run_in_shards scaling cpu "${1:-results/scaling}" "${2:-2}" "${@:3}"
