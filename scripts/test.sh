#!/usr/bin/env bash
# Run the test suite: sets up .venv (see setup_env.sh) on first use, then pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/routing -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m pytest "$@"
