"""The process group of a torchrun launch: join it, ask who is rank 0, wait for everyone, average.

torchrun describes each process with environment variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT). `init_from_env` joins that group; every other function here reads the
group that is initialised (by it, or by a test harness) and is a no-op in a single process, so
training code calls them unconditionally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnres.common.errors import InputError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class DistributedEnv:
    """This process's place in the group: global rank, world size, rank on its node, device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes logs, metrics and checkpoint metadata."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether torchrun (or an equivalent launcher) set RANK, WORLD_SIZE and LOCAL_RANK."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def init_from_env(device: str | torch.device = "cpu") -> DistributedEnv | None:
    """Join torchrun's process group; None when not launched by torchrun.

    The backend follows the device: "cuda" -> nccl on cuda:LOCAL_RANK (whatever index was asked
    for: one GPU per process), anything else -> gloo. Already initialised groups are reused.
    """
    if not launched_by_torchrun():
        return None
    if not dist.is_initialized():
        check_launch_variables()
    device = torch.device(device)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before NCCL starts, so each rank talks from its own GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return current_env(device)


def check_launch_variables() -> None:
    """InputError naming the variable when torchrun's variables are set but cannot describe a group: not
    integers, a rank outside the world, or no MASTER_ADDR/MASTER_PORT (variables left over in a shell)."""
    values = {name: os.environ[name] for name in TORCHRUN_VARIABLES}
    advice = (f"launch with torchrun (docs/how-to/scale-out.md), or unset {', '.join(TORCHRUN_VARIABLES)} to run "
              f"one process")
    for name, value in values.items():
        if not value.strip().isdigit():
            raise InputError(f"the environment variable {name}={value!r} is not a rank or size (a non-negative "
                             f"integer); {advice}")
    rank, world_size = int(values["RANK"]), int(values["WORLD_SIZE"])
    if not rank < world_size:
        raise InputError(f"the environment variables RANK={rank} and WORLD_SIZE={world_size} describe no process of "
                         f"the group (RANK must be below WORLD_SIZE); {advice}")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise InputError(f"{', '.join(TORCHRUN_VARIABLES)} are set, as torchrun sets them, but {' and '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not; {advice}")


def current_env(device: str | torch.device = "cpu") -> DistributedEnv | None:
    """The initialised process group as a DistributedEnv on `device`; None in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return DistributedEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)),
                          torch.device(device))


def shutdown() -> None:
    """Leave the process group, if one is initialised (at the end of a torchrun command)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main() -> bool:
    """True on rank 0 and in a single process."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (no-op in a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_mean(value: float) -> float:
    """The mean of `value` over ranks (itself in a single process), identical on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    return all_reduce_sum(value) / dist.get_world_size()


def all_reduce_sum(value: float) -> float:
    """The sum of `value` over ranks, in float64 (itself in a single process), identical on every rank."""
    return _float64_collective(value, dist.all_reduce)


def all_reduce_tensor_sum(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over ranks, in place and returned (itself in a single process). Every rank must
    call it with a tensor of the same shape and dtype."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def broadcast_value(value: float, src: int) -> float:
    """Rank `src`'s `value` on every rank (itself in a single process); the others' values are ignored."""
    return _float64_collective(value, lambda tensor: dist.broadcast(tensor, src=src))


def all_gather_objects(value) -> list:
    """[value of rank 0, value of rank 1, ...] on every rank ([value] in a single process).

    Pickles over the process group: only for small values this program made itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def main_first(fn):
    """Run fn() on rank 0, then on the other ranks, and return its result (e.g. to build a cache once
    and read it everywhere). When rank 0 raises, it re-raises and the others raise too, not hang."""
    if not (dist.is_available() and dist.is_initialized()):
        return fn()
    error = None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001  (re-raised below, after telling the other ranks)
            error = exc
    failed = [error is not None]
    dist.broadcast_object_list(failed, src=0)
    if error is not None:
        raise error
    if failed[0]:
        raise RuntimeError("rank 0 failed (its error is reported above); this rank stops too")
    return result if dist.get_rank() == 0 else fn()


class Silent:
    """Stands in for a rank-0-only object (metrics logger, progress bar) on the other ranks: every
    method call does nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def _float64_collective(value: float, collective) -> float:
    """`collective` (in place) on `value` as a float64 tensor; `value` itself in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    # NCCL reduces only CUDA tensors; gloo reduces CPU tensors.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    collective(tensor)
    return float(tensor)
