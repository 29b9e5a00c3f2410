#!/usr/bin/env bash
# Test attnres against the ends of the dependency ranges that pyproject.toml claims, beside the pinned
# set that tools/test.sh tests:
#   tools/test_deps.sh floor  [pytest args]   torch, transformers, safetensors and lm-eval at the floors
#                                               pyproject.toml names (read from it, so a changed floor is
#                                               what gets tested)
#   tools/test_deps.sh newest [pytest args]   the newest release of each on the registry
# Everything else is what pip resolves beside them, as a user installing those versions would get. The
# environment is .venv-deps/SET (ATTNRES_DEPS_DIR moves it), made again when the requirements in
# pyproject.toml change; the newest set is also upgraded in place on every run.
# Without pytest args, the tests that use these packages run: tests/hf, tests/checkpoint and every test
# file that imports transformers, safetensors or lm_eval. `tools/test_deps.sh newest tests` runs all.
# ATTNRES_DEPS_TORCH=2.13.0 keeps the newest set's torch at that release (the newest torch is a CUDA
# build of several GB). The newest torch may be above a local pip cap (/etc/xdg/pip/constraints.txt on some
# machines): for this set, the cap is lifted for these installs only (PIP_CONSTRAINT=/dev/null).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SET="${1:-}"
case "$SET" in
    floor|newest) shift ;;
    *) echo "usage: tools/test_deps.sh floor|newest [pytest args]" >&2; exit 2 ;;
esac
PY="${PYTHON:-python3}"
VENV="${ATTNRES_DEPS_DIR:-$ROOT/.venv-deps}/$SET"
say() { echo "test_deps ($SET): $*" >&2; }
# pip, without the lines this machine's pip configuration prints for index folders that lack a package
pip_install() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; } >&2; }

# The floor pyproject.toml claims for a dependency: "transformers>=5.24" -> 5.24
floor_of() {
    local found
    found="$(grep -oE "\"$1>=[0-9][0-9.]*" "$ROOT/pyproject.toml" | head -n 1 | cut -d= -f2)"
    [ -n "$found" ] || { echo "test_deps: pyproject.toml claims no floor for $1" >&2; exit 2; }
    echo "$found"
}

if [ "$SET" = floor ]; then
    TORCH="torch==$(floor_of torch)"
    WANTS=("transformers==$(floor_of transformers)" "safetensors==$(floor_of safetensors)"
           "lm-eval==$(floor_of lm-eval)")
    UPGRADE=()
else
    TORCH="torch${ATTNRES_DEPS_TORCH:+==$ATTNRES_DEPS_TORCH}"
    WANTS=(transformers safetensors lm-eval)
    UPGRADE=(--upgrade --upgrade-strategy eager)
    export PIP_CONSTRAINT=/dev/null
fi
# What the environment was made for: for the floors, pyproject.toml's requirement lines (comments
# aside); for the newest releases, their names only, and an existing environment is upgraded in place
# on every run instead (pip says quickly that nothing is newer).
STAMP="$VENV/.attnres-deps"
REQUIREMENTS="$(grep -E '^\s*"[A-Za-z0-9_.-]+(\[[a-z,]+\])?\s*[<>=!~]' "$ROOT/pyproject.toml")"
if [ "$SET" = newest ]; then REQUIREMENTS="$(sed -E 's/[<>=!~].*//' <<<"$REQUIREMENTS")"; fi
WANT="$(printf '%s\n' "$REQUIREMENTS" "$TORCH" | sha256sum | cut -d' ' -f1)"
PIP=(pip_install "$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    rm -rf "$VENV"
    say "making $VENV: $TORCH ${WANTS[*]} (a few minutes)"
    "$PY" -m venv "$VENV"
    # torch first and alone, so that pip takes the local CPU wheel where one is (see setup_env.sh),
    # then held at that release while the rest resolves
    "${PIP[@]}" "$TORCH"
    "$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' \
        > "$VENV/torch-constraint.txt"
    "${PIP[@]}" -c "$VENV/torch-constraint.txt" "${UPGRADE[@]}" -e "$ROOT[test,eval]" "${WANTS[@]}"
    echo "$WANT" > "$STAMP"
elif [ "$SET" = newest ]; then
    say "upgrading $VENV to the newest releases"
    "${PIP[@]}" "${UPGRADE[@]}" "$TORCH" -e "$ROOT[test,eval]" "${WANTS[@]}"
fi
# The fused CPU kernel, as setup_env.sh builds it (its cache is keyed by torch's version: a second run
# finds it built).
if command -v "${CXX:-c++}" >/dev/null; then "$VENV/bin/python" -m attnres.routing.fused_cpu_build >/dev/null; fi
"$VENV/bin/python" - <<'EOF' >&2
from importlib.metadata import version
print("test_deps: testing with " + ", ".join(f"{name} {version(name)}" for name in
      ("torch", "transformers", "safetensors", "lm_eval", "tokenizers", "huggingface_hub", "numpy")))
EOF
cd "$ROOT"
if [ "$#" -eq 0 ]; then
    mapfile -t USERS < <(grep -rlE "^\s*(import|from) (transformers|safetensors|lm_eval)\b" tests \
        --include='test_*.py' | grep -vE "^tests/(hf|checkpoint)/" | sort)
    set -- tests/hf tests/checkpoint "${USERS[@]}"
fi
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
