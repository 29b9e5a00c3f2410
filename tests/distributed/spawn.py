"""Run a test body in N CPU processes joined by a gloo process group.

The body's failures and the launcher's are told apart. Every rank reports to the parent: "done" when
the body returned, or its traceback when it raised. A failed body is never run again. A rank that dies
without reporting (killed, or aborted inside gloo on a loaded machine) is the launcher's failure: the
spawn is retried once, after `reset` clears what the first attempt wrote, and the test output says so.
A rank that dies after reporting "done" (in the group's teardown) has finished its work: that is said
too, and the run stands.

The rendezvous store is held by this (the parent) process, not by rank 0, so no rank's exit can pull
the store from under another rank that is still leaving the group.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import traceback
import warnings
from multiprocessing.connection import wait

import torch.distributed as dist
import torch.multiprocessing as mp

JOIN_TIMEOUT_S = 900  # the longest body (dp_runs: 13 trainings on 2 ranks) takes about 2 minutes alone
GRACE_S = 60  # after one rank dies unreported, how long the others get to finish before they are killed
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)  # a collective whose peer died fails instead of waiting 30 min


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LauncherFailure(Exception):
    """A rank died before it reported: the process launch failed, not the test body."""


def run_workers(fn, world_size: int, *args, reset=None) -> None:
    """Call fn(rank, world_size, *args) in `world_size` processes with a gloo group initialised
    (env:// variables set as torchrun would). Raises AssertionError if any rank's body fails, with
    its traceback. A launcher failure (a rank dead before it reported) is retried once, calling
    `reset()` first (it must clear what a partial attempt wrote; None: the body writes nothing)."""
    try:
        _spawn_once(fn, world_size, args)
    except LauncherFailure as failure:
        _say(f"{failure}; retrying the spawn once (a launcher failure, not a failed assertion)")
        if reset is not None:
            reset()
        try:
            _spawn_once(fn, world_size, args)
        except LauncherFailure as again:
            raise AssertionError(f"distributed launch failed twice: {failure}; then {again}") from None


def _say(message: str) -> None:
    """Shown in the test output: a warning in pytest's summary, and a line on stderr."""
    print(f"tests.distributed.spawn: {message}", file=sys.stderr, flush=True)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _spawn_once(fn, world_size: int, args: tuple) -> None:
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=COLLECTIVE_TIMEOUT)
    context = mp.get_context("spawn")
    reports = context.SimpleQueue()
    procs = [context.Process(target=_worker, args=(fn, rank, world_size, store.port, reports, args))
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    done, errors, killed = set(), [], set()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while any(proc.is_alive() for proc in procs):
        wait([proc.sentinel for proc in procs if proc.is_alive()], timeout=1.0)
        _read(reports, done, errors)  # as they come: a long traceback must not block its sender
        # A rank failed or died (the others may wait on it), or all are done and only leaving the
        # group: whoever is left gets GRACE_S, not the whole timeout.
        if errors or len(done) == world_size or any(p.exitcode not in (None, 0) and r not in done
                                                   for r, p in enumerate(procs)):
            deadline = min(deadline, time.monotonic() + GRACE_S)
        if time.monotonic() > deadline:
            break
    for rank, proc in enumerate(procs):
        if proc.is_alive():
            proc.kill()
            killed.add(rank)
        proc.join()
    _read(reports, done, errors)
    del store
    if errors:
        raise AssertionError("distributed worker failed:\n" + "\n".join(errors))
    dead = [(rank, proc.exitcode) for rank, proc in enumerate(procs) if rank not in done and rank not in killed]
    if dead:
        raise LauncherFailure("died before reporting: " + ", ".join(f"rank {r} (exit code {c})" for r, c in dead))
    if killed - done:
        raise AssertionError(f"distributed workers still running after {JOIN_TIMEOUT_S} s: ranks {sorted(killed)}")
    after = [(rank, proc.exitcode) for rank, proc in enumerate(procs) if proc.exitcode != 0]
    if after:
        _say("every rank finished its work, then " + ", ".join(f"rank {r} exited with code {c}" for r, c in after)
             + " while leaving the process group; the run stands")


def _read(reports, done: set, errors: list) -> None:
    """Move the reports waiting in the queue into `done` (ranks) and `errors` (tracebacks)."""
    while not reports.empty():
        kind, rank, text = reports.get()
        if kind == "done":
            done.add(rank)
        else:
            errors.append(f"rank {rank}:\n{text}")


def _worker(fn, rank: int, world_size: int, port: int, reports, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    finished = False
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
        fn(rank, world_size, *args)
        finished = True
        reports.put(("done", rank, ""))
    except BaseException:  # noqa: BLE001  (report every failure to the parent)
        reports.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            if finished:
                dist.barrier()  # no rank leaves the group while another is still in a collective
            dist.destroy_process_group()
