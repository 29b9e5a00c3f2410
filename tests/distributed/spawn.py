"""Run a test body in N CPU processes joined by a gloo process group."""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_workers(fn, world_size: int, *args) -> None:
    """Call fn(rank, world_size, *args) in `world_size` processes with a gloo group initialised
    (env:// variables set as torchrun would). Raises if any worker fails, with its traceback."""
    port = free_port()
    context = mp.get_context("spawn")
    errors = context.SimpleQueue()
    procs = [context.Process(target=_worker, args=(fn, rank, world_size, port, errors, args))
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            failures.append(f"a worker timed out (pid {proc.pid})")
        elif proc.exitcode != 0 and not failures:
            failures.append(f"a worker exited with code {proc.exitcode}")
    if failures:
        raise AssertionError("distributed worker failed:\n" + "\n".join(failures))


def _worker(fn, rank: int, world_size: int, port: int, errors, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001  (report every failure to the parent)
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
