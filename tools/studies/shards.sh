#!/usr/bin/env bash
# Sourced by the study scripts. run_in_shards COMMAND PRESET OUT SHARDS [ARGS...]: `attnres COMMAND
# --preset PRESET --out OUT ARGS` (compare or scaling) as SHARDS one-thread processes in parallel (one
# per core; logs in OUT/shardI.log), then one call that reuses their finished runs and writes the report.
run_in_shards() {
  local command="$1" preset="$2" out="$3" shards="$4"
  shift 4
  mkdir -p "$out"
  local pids=() i
  for ((i = 0; i < shards; i++)); do
    OMP_NUM_THREADS=1 attnres "$command" --preset "$preset" --out "$out" --shard "$i/$shards" "$@" \
      > "$out/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  attnres "$command" --preset "$preset" --out "$out" "$@"
}

# compare_in_shards PRESET OUT SHARDS [ARGS...]: run_in_shards for `attnres compare`.
compare_in_shards() { run_in_shards compare "$@"; }
