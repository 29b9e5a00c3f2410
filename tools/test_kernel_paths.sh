#!/usr/bin/env bash
# Run the tests that compare with files recorded on another machine (pytest marker `recorded`) on every
# ATen CPU kernel path below this CPU's own (avx2 and default, as ATEN_CPU_CAPABILITY names them), so
# that a test which only passes on the machine that recorded its files fails here first. CI runs this
# beside the whole suite on the CPU's own path. Each path gets a fresh inductor cache: a compiled
# kernel cached for AVX-512 must not be loaded under AVX2.
#   tools/test_kernel_paths.sh [pytest args]     e.g. `-m 'not compile'` to run the whole suite on each
# Extra pytest args replace the default `-m recorded`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
NATIVE="$(python -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')"
if [ "$#" -eq 0 ]; then set -- -m recorded; fi
for path in avx2 default; do
    if [ "$path" = "$NATIVE" ]; then
        echo "kernel paths: $path is this CPU's own (the whole suite runs on it)" >&2
        continue
    fi
    cache="$(mktemp -d "${TMPDIR:-/tmp}/attnres-inductor.XXXXXX")"
    echo "kernel paths: ATEN_CPU_CAPABILITY=$path (this CPU: $NATIVE): pytest $*" >&2
    status=0
    ATEN_CPU_CAPABILITY="$path" TORCHINDUCTOR_CACHE_DIR="$cache" python -m pytest -p no:cacheprovider "$@" || status=$?
    rm -rf "$cache"
    [ "$status" = 0 ] || exit "$status"
done
