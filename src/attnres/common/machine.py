"""What a measurement ran on: torch, the device and its name, threads, CPU bf16 support, the allocator.
Every report of times or losses records it, because CPU kernels (AVX2 / AVX-512, native or emulated
bf16) change both, and the allocator changes times."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from attnres.common.errors import InputError


def cpu_has_native_bf16() -> bool | None:
    """Whether the CPU advertises bf16 arithmetic (x86 avx512_bf16 / amx_bf16, Arm bf16); None if unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            flags.update(line.split(":", 1)[1].split())
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


# Shared objects that replace malloc when preloaded (LD_PRELOAD) or linked, by the name they map under.
_ALLOCATORS = {"libtcmalloc": "tcmalloc", "libjemalloc": "jemalloc", "libmimalloc": "mimalloc"}


def memory_allocator(maps: str | None = None) -> str | None:
    """The C allocator this process runs on: "tcmalloc", "jemalloc" or "mimalloc" where one is mapped,
    else "libc" (the C library's malloc); None where /proc/self/maps cannot be read (not Linux).
    `maps`: that file's text, for tests. Timings record it: it moves CPU step times, though not the
    routed variants' multiples of standard's (docs/how-to/measure-cost.md)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        library = line.rsplit("/", 1)[-1]
        for prefix, name in _ALLOCATORS.items():
            if library.startswith(prefix):
                return name
    return "libc"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else every CPU)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_info(device: torch.device) -> dict:
    """torch version, device and its name, torch threads, CPU count, Python, platform, CPU bf16 support,
    the CPU kernel family ATen dispatches to ("AVX512", "AVX2", ...; ATEN_CPU_CAPABILITY overrides it)
    and the C allocator (`memory_allocator`)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {"torch": torch.__version__, "device": str(device), "device_name": name,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "cpu_native_bf16": cpu_has_native_bf16(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_allocator": memory_allocator()}


def cpu_facts(machine: dict) -> list[str]:
    """What a report says of a record's CPU, where the record has it (older ones lack some):
    ["ATen CPU kernels AVX512", "native bf16: yes", "allocator: libc"]."""
    facts = [f"ATen CPU kernels {machine['cpu_capability']}"] if machine.get("cpu_capability") else []
    if machine.get("cpu_native_bf16") is not None:
        facts.append(f"native bf16: {'yes' if machine['cpu_native_bf16'] else 'no'}")
    if machine.get("cpu_allocator"):
        facts.append(f"allocator: {machine['cpu_allocator']}")
    return facts


def check_device(device: str, flag: str = "--device") -> torch.device:
    """torch.device for `device` ("cpu", "cuda" or "cuda:N"); InputError naming `flag` for any other text,
    for CUDA where there is none and for an index past the devices present (not checked under torchrun,
    which gives each process cuda:LOCAL_RANK whatever index was asked for)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise InputError(f"{flag} must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{flag} {device}: CUDA is not available here (torch {torch.__version__}); "
                             f"use {flag} cpu")
        if dev.index is not None and "LOCAL_RANK" not in os.environ and dev.index >= torch.cuda.device_count():
            raise InputError(f"{flag} {device}: only {torch.cuda.device_count()} CUDA device(s) present")
    return dev


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory_bytes(device: torch.device) -> int | None:
    """Memory a process on `device` can ever hold, in bytes: a CUDA device's total memory; on CPU the
    physical memory, or the container's limit where a cgroup sets a lower one. None where it cannot be
    read. Total, not free: a size above it can never fit, whatever else is running."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # an OS that does not say
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" means no limit; cgroup v1 writes a huge number instead
            limits.append(int(text))
    return min(limits) if limits else None
