#!/usr/bin/env bash
# Run the test suite: sets up .venv (see setup_env.sh) on first use, then pytest.
# Extra arguments go to pytest, e.g. `tools/test.sh tests/routing -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
# A kernel path chosen by hand (ATEN_CPU_CAPABILITY=avx2 tools/test.sh) gets an inductor cache of its
# own: a compiled decode step cached by AVX-512 runs crashed when loaded under avx2 (issue 38).
if [ -n "${ATEN_CPU_CAPABILITY:-}" ] && [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
    export TORCHINDUCTOR_CACHE_DIR="${TMPDIR:-/tmp}/torchinductor_$(id -un)_${ATEN_CPU_CAPABILITY,,}"
fi
exec python -m pytest "$@"
