#!/usr/bin/env bash
# The fair fight's seeds 0 and 1 again on another floating-point path (docs/explanation/fair-fight.md):
# configs/compare/fair_dense_kernels.yaml under ATEN_CPU_CAPABILITY=avx2 on a CPU whose own kernels are
# AVX-512, else under ATEN_CPU_CAPABILITY=default (the scalar kernels), in two one-thread shards.
# `python -m tools.pages` then sets each paired difference beside the same seed's in results/fair-dense.
# Usage: tools/studies/fair_kernels.sh [OUT (default results/fair-dense-kernels)] [SHARDS (default 2)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
NATIVE="$(python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"
case "$NATIVE" in
  AVX512*) OTHER=avx2 ;;
  *) OTHER=default ;;
esac
echo "fair_kernels: this CPU's kernels are $NATIVE; rerunning on ATEN_CPU_CAPABILITY=$OTHER"
# its own inductor cache, as tools/test.sh gives a hand-set kernel path (nothing here compiles today)
export TORCHINDUCTOR_CACHE_DIR="${TMPDIR:-/tmp}/attnres-inductor-$OTHER"
ATEN_CPU_CAPABILITY="$OTHER" exec "$ROOT/tools/studies/fair.sh" fair_dense_kernels "${1:-results/fair-dense-kernels}" "${2:-2}"
