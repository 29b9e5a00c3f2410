#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv with pinned dependencies.
# torch==2.13.0 goes in first and alone: pip then takes the local CPU wheel instead of a
# multi-GB CUDA build pulled in by an unpinned requirement.
# Sourced by scripts/compare.sh, scripts/test.sh and .ci/run; safe to run repeatedly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ATTNRES_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.attnres-installed"
WANT="$(cat "$ROOT/requirements/test.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements/test.txt"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$ROOT"
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
