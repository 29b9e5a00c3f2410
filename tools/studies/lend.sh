#!/usr/bin/env bash
# Lends a waiting shard's core to the next study (docs/explanation/protocol.md, "Order and budget"): while
# shard i of FIRST waits for the other shard's runs, or after FIRST's shards have ended, shard i of NEXT
# trains; when FIRST's shard has runs again, NEXT's is paused (SIGSTOP, nothing lost) until it waits again.
# Start FIRST first (tools/studies/protocol.sh FIRST); this only watches it, once a minute, until stopped.
# Usage: tools/studies/lend.sh FIRST NEXT [SHARDS (default 2)], e.g. lend.sh protocol_dense protocol_kjv
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tools/setup_env.sh"
cd "$ROOT"
FIRST="${1:?usage: tools/studies/lend.sh FIRST NEXT [SHARDS]}"
NEXT="${2:?usage: tools/studies/lend.sh FIRST NEXT [SHARDS]}"
SHARDS="${3:-2}"
first_out="results/${FIRST//_/-}" next_out="results/${NEXT//_/-}"
mkdir -p "$next_out"
declare -A lent
# stopped, a lent shard is never left paused: it goes on by itself
trap 'for p in "${lent[@]}"; do kill -CONT "$p" 2>/dev/null; done' EXIT
trap 'exit 143' TERM INT
while :; do
    for ((i = 0; i < SHARDS; i++)); do
        pid="${lent[$i]:-}"
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then pid=""; lent[$i]=""; fi
        if ! pgrep -f "attnres compare --preset $FIRST --out $first_out --shard $i/$SHARDS" >/dev/null \
            || [[ "$(tail -n 1 "$first_out/shard$i.log" 2>/dev/null)" == "compare: waiting"* ]]; then
            if [ -z "$pid" ]; then
                OMP_NUM_THREADS=1 attnres compare --preset "$NEXT" --out "$next_out" --shard "$i/$SHARDS" \
                    >> "$next_out/shard$i.log" 2>&1 &
                lent[$i]=$!
                echo "$(date -u +%FT%TZ) shard $i: $NEXT started (pid ${lent[$i]})"
            elif [[ "$(ps -o stat= -p "$pid")" == T* ]]; then
                kill -CONT "$pid" && echo "$(date -u +%FT%TZ) shard $i: $NEXT continued"
            fi
        elif [ -n "$pid" ] && [[ "$(ps -o stat= -p "$pid")" != T* ]]; then
            kill -STOP "$pid" && echo "$(date -u +%FT%TZ) shard $i: $NEXT paused, $FIRST has runs again"
        fi
    done
    sleep 60
done
