#!/usr/bin/env bash
# How long a new user waits: the README's two commands in a fresh clone of HEAD, on an idle machine (stop
# every study first). Times the first set-up (tools/setup_env.sh creating .venv), the test suite
# (tools/test.sh, with .venv in place) and the main job (tools/compare.sh, the default preset), and writes
# results/timings/timings.json (refused where it exists, unless --force).
# Usage: tools/studies/timings.sh [--force]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/results/timings/timings.json"
if [ -e "$OUT" ] && [ "${1:-}" != "--force" ]; then
    echo "$OUT exists; pass --force to replace it" >&2
    exit 1
fi
CLONE="$(mktemp -d)/attnres"
git clone -q "$ROOT" "$CLONE"
cd "$CLONE"
commit="$(git rev-parse --short HEAD)"
start=$SECONDS; (source tools/setup_env.sh); setup_s=$((SECONDS - start))
start=$SECONDS; tools/test.sh > tests.log 2>&1 || { tail -n 20 tests.log; exit 1; }
tests_s=$((SECONDS - start))
start=$SECONDS; tools/compare.sh > compare.log 2>&1 || { tail -n 20 compare.log; exit 1; }
compare_s=$((SECONDS - start))
summary="$(tail -n 1 tests.log | tr -d '=' | sed 's/^ *//; s/ *$//')"
mkdir -p "$(dirname "$OUT")"
.venv/bin/python - "$OUT" "$commit" "$setup_s" "$tests_s" "$compare_s" "$summary" <<'EOF'
import json, sys
from datetime import datetime, timezone

import torch

from attnres.common.atomic import write_atomic
from attnres.common.machine import machine_info

out, commit, setup_s, tests_s, compare_s, summary = sys.argv[1:]
write_atomic(out, json.dumps({
    "command": f"tools/studies/timings.sh (a fresh clone of {commit}: tools/setup_env.sh, tools/test.sh, "
               "tools/compare.sh, one after another)",
    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    "machine": machine_info(torch.device("cpu")),
    "note": "wall time on an idle machine; the set-up took its packages from this machine's package index and "
            "the routing extension from its build cache, so a new machine adds its downloads and about 20 s of "
            f"build; tests: {summary}",
    "setup_s": int(setup_s), "tests_s": int(tests_s), "main_job_s": int(compare_s)}, indent=2) + "\n")
EOF
echo "set-up ${setup_s} s, tests ${tests_s} s, main job ${compare_s} s -> $OUT"
