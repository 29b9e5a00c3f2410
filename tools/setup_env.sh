#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv with pinned dependencies.
# torch==2.13.0 goes in first and alone: pip then takes the local CPU wheel instead of a
# multi-GB CUDA build pulled in by an unpinned requirement.
# Sourced by tools/compare.sh, tools/test.sh and .ci/run; safe to run repeatedly. Prints one
# line per stage (to stderr, so a caller's stdout stays its own), and a line every 20 s while a
# stage runs, so a first set-up (3 to 4 minutes on 2 cores) never looks stuck.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ATTNRES_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.attnres-installed"
WANT="$(cat "$ROOT/requirements/test.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"

_setup_say() { echo "attnres setup: $*" >&2; }

# _setup_stage LABEL COMMAND...: run COMMAND, saying when it starts, every 20 s while it runs (with
# the last line it printed), and how long it took; its full output is shown only if it fails, then
# $SETUP_HINT if set (what else to do).
_setup_stage() {
    local label="$1" start=$SECONDS log status=0 ticker
    shift
    log="$(mktemp)"
    _setup_say "$label ..."
    # Sleeps of 1 s: when the stage ends and the ticker is killed, its last sleep (which may hold
    # the caller's output pipe open) ends within a second.
    (while :; do
        for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 1; done
        _setup_say "  ... $((SECONDS - start)) s so far: $(tail -n 1 "$log" 2>/dev/null | cut -c1-70)"
    done) &
    ticker=$!
    "$@" >"$log" 2>&1 || status=$?
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    if [ "$status" -ne 0 ]; then
        cat "$log" >&2
        rm -f "$log"
        _setup_say "FAILED: $label (exit $status); its output is above"
        if [ -n "${SETUP_HINT:-}" ]; then _setup_say "$SETUP_HINT"; fi
        return "$status"
    fi
    rm -f "$log"
    _setup_say "  done in $((SECONDS - start)) s"
}

if [ ! -x "$VENV/bin/python" ]; then
    _setup_stage "creating the virtual environment $VENV" "$PY" -m venv "$VENV"
fi
INSTALLED=0
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    _setup_say "installing pinned dependencies into $VENV (first time: 3 to 4 minutes on 2 cores)"
    PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
    _setup_stage "1/3 torch 2.13.0 (the CPU wheel)" "${PIP[@]}" "torch==2.13.0"
    _setup_stage "2/3 $(grep -c '==' "$ROOT/requirements/test.txt") pinned packages of requirements/test.txt" \
        "${PIP[@]}" -r "$ROOT/requirements/test.txt"
    _setup_stage "3/3 attnres itself (editable)" "${PIP[@]}" --no-deps -e "$ROOT"
    echo "$WANT" > "$STAMP"
    INSTALLED=1
fi
# The fused CPU routing extension (src/attnres/routing/csrc), compiled for this machine with g++ and
# ninja into ~/.cache/attnres/extensions (attnres/routing/fused_cpu.py says why and how). It is
# optional: routing_impl "auto" uses the lean PyTorch ops on CPU without it. Built again when its
# source or the environment changed, or when the built file is gone; its stamp holds a hash of what
# it was built from and the library's path (or "no compiler"). ATTNRES_BUILD_FUSED_CPU=0 skips it.
# Without a C++ compiler (the one torch.utils.cpp_extension would call: $CXX's first word, else c++,
# looked up on PATH, as attnres.routing.fused_cpu.find_compiler does) the set-up says so once and
# goes on; with one, a failed build fails the set-up, with the compiler's output.
_setup_find_cxx() {
    local cxx=""
    read -r cxx _ <<<"${CXX-c++}" || true
    [ -n "$cxx" ] && type -P "$cxx"
}
EXT_STAMP="$VENV/.attnres-fused-cpu"
EXT_WANT="$(cat "$ROOT/src/attnres/routing/csrc/"*.cpp "$ROOT/src/attnres/routing/fused_cpu.py" "$STAMP" \
    | sha256sum | cut -d' ' -f1)"
EXT_HAD="$(head -n 1 "$EXT_STAMP" 2>/dev/null || true)"
EXT_BUILT="$(sed -n 2p "$EXT_STAMP" 2>/dev/null || true)"
if [ "${ATTNRES_BUILD_FUSED_CPU:-1}" != 0 ] && { [ "$EXT_HAD" != "$EXT_WANT" ] || [ ! -f "$EXT_BUILT" ]; }; then
    if ! _setup_find_cxx >/dev/null; then
        # Said once: the stamp remembers it, until the source changes or a compiler turns up.
        if [ "$EXT_HAD" != "$EXT_WANT" ] || [ "$EXT_BUILT" != "no compiler" ]; then
            if [ -n "${CXX+set}" ]; then _setup_why="CXX=$CXX is not on PATH"; else
                _setup_why="CXX is unset and c++ is not on PATH"; fi
            _setup_say "fused CPU routing kernel off: no C++ compiler found ($_setup_why); routing_impl" \
                "'auto' uses the lean PyTorch ops instead. To turn it on, install g++ (Debian/Ubuntu:" \
                "apt-get install g++) and run this set-up again (or: python -m attnres.routing.fused_cpu_build)"
            printf '%s\nno compiler\n' "$EXT_WANT" > "$EXT_STAMP"
            INSTALLED=1
        fi
    else
        rm -f "$EXT_STAMP.path"
        SETUP_HINT="to set up without the fused CPU kernel (routing_impl 'auto' then uses the lean PyTorch ops), \
run again with ATTNRES_BUILD_FUSED_CPU=0" \
            _setup_stage "building the fused CPU routing extension (about 20 s)" \
            "$VENV/bin/python" -m attnres.routing.fused_cpu_build --path-file "$EXT_STAMP.path"
        if [ -f "$EXT_STAMP.path" ]; then
            { echo "$EXT_WANT"; cat "$EXT_STAMP.path"; } > "$EXT_STAMP"
            rm -f "$EXT_STAMP.path"
        fi
        INSTALLED=1
    fi
fi
if [ "$INSTALLED" = 1 ]; then
    _setup_say "ready: $VENV/bin/attnres, $VENV/bin/python (or: source $VENV/bin/activate)"
else
    _setup_say "$VENV is up to date"
fi
export PATH="$VENV/bin:$PATH"
