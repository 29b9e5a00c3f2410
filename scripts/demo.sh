#!/usr/bin/env bash
# The main job: sets up .venv (see setup_env.sh) on first use, then runs `attnres demo`.
# Extra arguments go to the demo, e.g. `scripts/demo.sh --steps 60`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec attnres demo "$@"
