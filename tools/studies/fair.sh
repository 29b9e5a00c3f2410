#!/usr/bin/env bash
# The fair-comparison protocol (docs/explanation/results.md): `attnres compare --preset PRESET` for a preset
# with a `protocol:` section (learning-rate search per variant, then the final seeds on the test split), as
# SHARDS one-thread processes in parallel (shard i trains the seeds i mod SHARDS; a shard waits where a
# stage needs the others' runs), then one call that writes the report. Finished runs are reused, so a study
# is built up over several sittings; their records (runs/**/compare_record.json) are committed with it.
# Usage: tools/studies/fair.sh [PRESET (default fair_dense)] [OUT (default results/fair-dense)] [SHARDS (default 2)]
#        [--seeds N, --set ... passed on]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
source "$ROOT/tools/studies/shards.sh"
cd "$ROOT"
PRESET="${1:-fair_dense}"
OUT="${2:-results/fair-dense}"
SHARDS="${3:-2}"
compare_in_shards "$PRESET" "$OUT" "$SHARDS" "${@:4}"
