#!/usr/bin/env bash
# The protocol's studies (docs/explanation/protocol.md): tools/studies/fair.sh for one of the protocol_*
# presets, its results in results/<preset, - for _>. Finished runs are reused, so a study is built up over
# several sittings; commit each finished run's record (results/<study>/runs/**/compare_record.json).
# Usage: tools/studies/protocol.sh PRESET [SHARDS (default 2)] [--set ... passed on]
set -euo pipefail
PRESET="${1:?usage: tools/studies/protocol.sh PRESET [SHARDS] [ARGS...]}"
exec "$(dirname "${BASH_SOURCE[0]}")/fair.sh" "$PRESET" "results/${PRESET//_/-}" "${2:-2}" "${@:3}"
