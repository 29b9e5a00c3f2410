#!/usr/bin/env bash
# Sourced by the study scripts. compare_in_shards PRESET OUT SHARDS [ARGS...]: `attnres compare
# --preset PRESET --out OUT ARGS` as SHARDS one-thread processes in parallel (one per core; logs in
# OUT/shardI.log), then one call that reuses their finished runs and writes the report.
compare_in_shards() {
  local preset="$1" out="$2" shards="$3"
  shift 3
  mkdir -p "$out"
  local pids=() i
  for ((i = 0; i < shards; i++)); do
    OMP_NUM_THREADS=1 attnres compare --preset "$preset" --out "$out" --shard "$i/$shards" "$@" \
      > "$out/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  attnres compare --preset "$preset" --out "$out" "$@"
}
