#!/usr/bin/env bash
# Install attnres as a user would, into an environment of their own, and use it (CI runs this).
#   1. build the wheel (not an editable install) from a copy of the working tree's files;
#   2. make a fresh virtual environment; install torch==2.13.0 first and alone (pip then takes the
#      local CPU wheel, not a multi-GB CUDA build), then the wheel with its core dependencies only,
#      unpinned beyond torch, as pyproject.toml declares them;
#   3. from a folder outside the repository, with an empty extensions cache (the fused CPU kernel
#      not built), run tools/wheel_smoke.py core: the package's files, a drop-in nanoGPT-style
#      training with two variants, AttnResLM forward/backward, the one-time note, and the one line a
#      command without its extra gives; then install the hf extra and convert a checkpoint
#      (wheel_smoke.py hf), then the train extra and load the bundled presets (wheel_smoke.py train).
# Prints one line per stage with its time. PYTHON picks the interpreter (default python3);
# ATTNRES_WHEEL_DIR keeps the folder (wheel, venv, logs) instead of a temporary one removed at exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ -n "${ATTNRES_WHEEL_DIR:-}" ]; then
    WORK="$ATTNRES_WHEEL_DIR"
    mkdir -p "$WORK"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/attnres-wheel.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
fi
BEGIN=$SECONDS

_wheel_say() { echo "wheel check: $*" >&2; }

# _wheel_step LABEL COMMAND...: run COMMAND quietly; on failure show its output and stop.
_wheel_step() {
    local label="$1" start=$SECONDS
    shift
    _wheel_say "$label ..."
    if ! "$@" >"$WORK/step.log" 2>&1; then
        cat "$WORK/step.log" >&2
        _wheel_say "FAILED: $label; its output is above"
        exit 1
    fi
    _wheel_say "  done in $((SECONDS - start)) s"
}

# The files git would carry (tracked and new, not ignored) that exist: no build/ or egg-info of an
# editable install, no stale copies of deleted modules.
_wheel_copy_tree() {
    mkdir -p "$WORK/src"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
    (cd "$WORK/src" && find src/attnres -type f ! -name '*.pyc' | sed 's|^src/attnres/||' | sort) > "$WORK/expected.txt"
}

rm -rf "$WORK/src" "$WORK/dist" "$WORK/venv" "$WORK/run" "$WORK/extensions"
_wheel_step "copying the working tree's files" _wheel_copy_tree
_wheel_step "creating a fresh virtual environment" "$PY" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/python" -m pip install --disable-pip-version-check)
_wheel_step "building the wheel" "$WORK/venv/bin/python" -m pip wheel --disable-pip-version-check --no-deps \
    -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/attnres-*.whl)"
_wheel_step "installing torch 2.13.0 (the CPU wheel)" "${PIP[@]}" "torch==2.13.0"
_wheel_step "installing $(basename "$WHEEL") alone (no extras)" "${PIP[@]}" "$WHEEL"
mkdir -p "$WORK/run" "$WORK/extensions"
# _wheel_smoke STAGE ARGS...: tools/wheel_smoke.py STAGE from $WORK/run, outside the repository
_wheel_smoke() {
    local start=$SECONDS
    _wheel_say "smoke test '$1' from $WORK/run (outside the repository), fused CPU kernel not built ..."
    (cd "$WORK/run" && env -u PYTHONPATH ATTNRES_EXTENSIONS_DIR="$WORK/extensions" \
        "$WORK/venv/bin/python" "$ROOT/tools/wheel_smoke.py" "$@")
    _wheel_say "  done in $((SECONDS - start)) s"
}
_wheel_smoke core "$ROOT" "$WORK/expected.txt"
_wheel_step "installing the hf extra" "${PIP[@]}" "$WHEEL[hf]"
_wheel_smoke hf "$ROOT"
_wheel_step "installing the train extra" "${PIP[@]}" "$WHEEL[train]"
_wheel_smoke train "$ROOT"
_wheel_say "passed in $((SECONDS - BEGIN)) s"
