#!/usr/bin/env bash
# The main job: sets up .venv (see setup_env.sh) on first use, then runs `attnres compare`
# (default preset: every variant on a 16-layer model, real text, 6 to 13 minutes on 2 CPU cores).
# Extra arguments go to the command, e.g. `tools/compare.sh --preset smoke --out reports/smoke`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec attnres compare "$@"
