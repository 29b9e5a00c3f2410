"""Bytes sent between pipeline stages per training step, with and without the cross-stage cache.

Measured: a small model run for one step on CPU processes joined by gloo, every residual variant
under GPipe, 1F1B and interleaved 1F1B (V = 2, 4); the byte counter's totals over all ranks. Each
measurement is checked against the layout's prediction (micro-batches x tensors per transition x
bytes per (b, T, D) tensor), which then extrapolates to a paper-scale shape without running it.

    .venv/bin/python tools/benchmarks/pipeline_bytes.py [--ranks 2] [--out results/pipeline-bytes]
    torchrun --nproc-per-node 2 tools/benchmarks/pipeline_bytes.py       # the same, launched by torchrun

Prints both tables (Markdown) and writes OUT/results.json: every measured row (bytes forward and
backward per step, the largest transition per micro-batch, and the layout's prediction, without and
with the cache) and every predicted row of the paper shape, with the command, date, machine and settings.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnres.common.atomic import write_atomic
from attnres.common.machine import machine_info
from attnres.distributed.pipeline import build_pipeline
from attnres.distributed.pipeline_layout import PipelineConfig, build_layout, tensor_bytes
from attnres.model.model_config import ModelConfig
from attnres.model.decoder import AttnResLM
from attnres.report.document import dumps_json, jsonable
from attnres.routing.route import resolve_impl

VARIANTS = {"standard": None, "block_attnres": 8, "delta_block": 4, "full_attnres": None, "delta_attnres": None}
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved1f1b", 2), ("interleaved1f1b", 4)]
SMALL = dict(vocab_size=256, hidden_size=64, num_layers=8, num_heads=4, num_kv_heads=2, intermediate_size=128,
             tie_embeddings=False, max_seq_len=32)
SMALL_RUN = dict(num_microbatches=4, microbatch_size=2, seq_len=32)
# The qwen3-1044m paper shape (1280 x 36, configs/paper/qwen3-1044m.yaml), bf16, 4 ranks; blocks of
# 6 sub-layers (12 blocks) for the block variants.
LARGE = dict(vocab_size=151936, hidden_size=1280, num_layers=36, num_heads=16, num_kv_heads=8, head_dim=128,
             intermediate_size=4096, max_seq_len=2048)
LARGE_RUN = dict(num_microbatches=8, microbatch_size=1, seq_len=2048)
LARGE_VARIANTS = {"standard": None, "block_attnres": 12, "delta_block": 12, "full_attnres": None,
                  "delta_attnres": None}
LARGE_SCHEDULES = [("1f1b", 1), ("interleaved1f1b", 3), ("interleaved1f1b", 9)]


def blocks_option(num_blocks: int | None) -> dict:
    """The residual options of a table entry: its block count, where it has one."""
    return {} if num_blocks is None else {"num_blocks": num_blocks}


def measure(rank: int, world_size: int, variants: list[str] | None = None) -> list[dict]:
    """Run every (variant, schedule, cache) for one step; rows of measured and predicted bytes.
    variants: names from VARIANTS (default all)."""
    rows = []
    for residual in variants or VARIANTS:
        num_blocks = VARIANTS[residual]
        config = ModelConfig(**SMALL, residual=residual, residual_options=blocks_option(num_blocks))
        torch.manual_seed(0)
        model = AttnResLM(config)
        ids = torch.randint(0, config.vocab_size, (SMALL_RUN["num_microbatches"] * SMALL_RUN["microbatch_size"],
                                                   SMALL_RUN["seq_len"]), generator=torch.Generator().manual_seed(0))
        for schedule, stages_per_rank in SCHEDULES:
            row = dict(residual=residual, num_blocks=num_blocks, schedule=schedule, ranks=world_size,
                       stages_per_rank=stages_per_rank)
            for cache in (False, True):
                pipe_config = PipelineConfig(schedule=schedule, stages_per_rank=stages_per_rank, cache=cache,
                                             allow_partial_blocks=True, **SMALL_RUN)
                pipe = build_pipeline(model, pipe_config)
                model.zero_grad(set_to_none=True)
                pipe.step(ids, ids)
                totals = pipe.counter.totals()
                expected = pipe.layout.bytes_per_step(tensor_bytes(config, pipe_config, 4),
                                                      pipe_config.num_microbatches)
                if not totals.forward_sent == totals.backward_sent == expected:
                    raise AssertionError(f"{row} cache={cache}: measured {totals}, layout predicts {expected}")
                key = "cached" if cache else "uncached"
                row[f"{key}_forward"], row[f"{key}_backward"] = totals.forward_sent, totals.backward_sent
                row[f"{key}_peak"] = max(totals.forward_per_edge) // pipe_config.num_microbatches
                row[f"{key}_predicted"] = expected  # each direction
            rows.append(row)
    return rows


def predict(num_ranks: int = 4) -> list[dict]:
    """Bytes per step for the paper shape from the layout alone (bf16: 2 bytes per element)."""
    rows = []
    for residual, num_blocks in LARGE_VARIANTS.items():
        config = ModelConfig(**LARGE, residual=residual, residual_options=blocks_option(num_blocks))
        for schedule, stages_per_rank in LARGE_SCHEDULES:
            row = dict(residual=residual, num_blocks=num_blocks, schedule=schedule, ranks=num_ranks,
                       stages_per_rank=stages_per_rank)
            for cache in (False, True):
                pipe_config = PipelineConfig(schedule=schedule, stages_per_rank=stages_per_rank, cache=cache,
                                             allow_partial_blocks=True, **LARGE_RUN)
                layout = build_layout(config, pipe_config, num_ranks)
                nbytes = tensor_bytes(config, pipe_config, 2)
                key = "cached" if cache else "uncached"
                row[f"{key}_forward"] = row[f"{key}_backward"] = layout.bytes_per_step(
                    nbytes, pipe_config.num_microbatches)
                row[f"{key}_peak"] = max(edge.num_tensors for edge in layout.edges) * nbytes
            rows.append(row)
    return rows


def table(rows: list[dict], unit: int, unit_name: str) -> str:
    """Markdown: forward bytes per step (backward is equal) and the largest transition per micro-batch."""
    lines = [f"| residual | schedule | P x V | forward / step, no cache ({unit_name}) | with cache ({unit_name}) | "
             f"saved | largest transition / micro-batch, no cache -> cache ({unit_name}) |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        off, on = r["uncached_forward"], r["cached_forward"]
        lines.append(f"| {r['residual']} | {r['schedule']} | {r['ranks']} x {r['stages_per_rank']} | "
                     f"{off / unit:,.2f} | {on / unit:,.2f} | {off / on:.2f}x | "
                     f"{r['uncached_peak'] / unit:,.2f} -> {r['cached_peak'] / unit:,.2f} "
                     f"({r['uncached_peak'] / r['cached_peak']:.2f}x) |")
    return "\n".join(lines)


def _worker(rank: int, world_size: int, port: int, queue, variants: list[str] | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        rows = measure(rank, world_size, variants)
        if rank == 0:
            queue.put(rows)
    finally:
        dist.destroy_process_group()


def report(rows: list[dict], predicted: list[dict]) -> str:
    """Both tables as Markdown."""
    return ("## Measured (one step, fp32, CPU/gloo)\n\n"
            f"Model {SMALL}, run {SMALL_RUN}; bytes summed over ranks; backward bytes equal forward.\n\n"
            + table(rows, 1024, "KiB")
            + "\n\n## Predicted by the layout for the qwen3-1044m shape (bf16)\n\n"
            f"Model {LARGE}, run {LARGE_RUN}, 4 ranks, "
            "blocks of 6 sub-layers.\n\n" + table(predicted, 2**20, "MiB") + "\n")


def write_results(out: Path, rows: list[dict], predicted: list[dict], command: str, args, seconds: float) -> Path:
    """OUT/results.json: the measured and predicted rows with what produced them."""
    document = {
        "command": command, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(torch.device("cpu")),
        "code_path": {"precision": "fp32", "routing_impl": "auto",
                      "routing": resolve_impl("auto", torch.device("cpu"), quiet=True)},
        "settings": {"ranks": rows[0]["ranks"] if rows else args.ranks, "backend": "gloo", "threads_per_rank": 1,
                     "variants": {name: VARIANTS[name] for name in args.variants or VARIANTS},
                     "schedules": [list(s) for s in SCHEDULES], "model": SMALL, "run": SMALL_RUN,
                     "bytes_per_element": 4,
                     "predicted": {"model": LARGE, "run": LARGE_RUN, "ranks": 4, "variants": LARGE_VARIANTS,
                                   "schedules": [list(s) for s in LARGE_SCHEDULES], "bytes_per_element": 2}},
        "units": "bytes per training step, summed over ranks; *_peak: the largest transition per micro-batch; "
                 "*_predicted: the layout's prediction for each direction",
        "seconds": seconds, "measured": rows, "predicted": predicted}
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / "results.json", dumps_json(jsonable(document)) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="measure only these (default all)")
    parser.add_argument("--out", default="results/pipeline-bytes", help="folder of results.json")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    script = os.path.relpath(__file__)
    start = time.perf_counter()
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        rows = measure(dist.get_rank(), dist.get_world_size(), args.variants)
        if dist.get_rank() == 0:
            command = shlex.join(["torchrun", f"--nproc-per-node={dist.get_world_size()}", script, *argv])
            finish(rows, command, args, start)
        dist.destroy_process_group()
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(args.ranks, port, queue, args.variants), nprocs=args.ranks, join=True)
    finish(queue.get(), shlex.join([os.path.relpath(sys.executable), script, *argv]), args, start)


def finish(rows: list[dict], command: str, args, start: float) -> None:
    predicted = predict()
    print(report(rows, predicted))
    path = write_results(Path(args.out), rows, predicted, command, args, time.perf_counter() - start)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
