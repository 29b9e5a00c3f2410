"""This machine's memory read bandwidth: the limit of a decode step, which reads every weight once.

A figure that holds still (issue 42): the buffer summed is several times the last-level cache the
machine reports (`buffer_bytes`), so the passes read memory rather than the cache; the figure is the
median of repeated passes after an untimed one; and it is measured once per machine and thread
count and kept, as compile times are (attnres.generation.compile_choice), so every later run reports
the same limit. Reading is what decoding does, so this is a read (a sum), not a copy.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres.common.machine import machine_info, machine_memory_bytes
from attnres.generation.compile_choice import inductor_cache_file, read_records, write_records
from attnres.generation.memory_traffic import GB, median_pass_seconds

LLC_MULTIPLE = 8  # the buffer is at least this many times the last-level cache
MIN_BUFFER_BYTES = 256 * 2 ** 20  # and at least this (a machine that reports no cache size)
MAX_MEMORY_SHARE = 8  # and at most 1/8 of physical memory
REPEATS = 9
FILE_NAME = "attnres-read-bandwidth.json"
_SIZE_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


def last_level_cache_bytes(sysfs: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest data or unified cache the OS reports for CPU 0, in bytes; None where it reports none."""
    sizes = []
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        if kind == "Instruction" or not size:
            continue
        unit = _SIZE_UNITS.get(size[-1], 1)
        digits = size[:-1] if size[-1] in _SIZE_UNITS else size
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=None)


def buffer_bytes(cache_bytes: int | None, memory_bytes: int | None = None) -> int:
    """Bytes to read per pass: LLC_MULTIPLE x the last-level cache and at least MIN_BUFFER_BYTES, at
    most 1/MAX_MEMORY_SHARE of `memory_bytes` (physical memory, where known)."""
    size = max(MIN_BUFFER_BYTES, LLC_MULTIPLE * (cache_bytes or 0))
    if memory_bytes:
        size = min(size, memory_bytes // MAX_MEMORY_SHARE)
    return size


def physical_memory_bytes() -> int | None:
    """This machine's memory in bytes (a container's limit where lower); None where the OS does not say
    (`attnres.common.machine.machine_memory_bytes` on CPU, which the size checks use too)."""
    return machine_memory_bytes(torch.device("cpu"))


def measure_read_bandwidth(nbytes: int, repeats: int = REPEATS) -> float:
    """GB/s read by summing an fp32 buffer of `nbytes` with torch's current threads: the median of
    `repeats` timed passes after one untimed pass (page faults and clock ramp are not bandwidth)."""
    buffer = torch.ones(nbytes // 4)
    return buffer.numel() * 4 / median_pass_seconds(buffer.sum, repeats) / GB


@dataclass(frozen=True)
class ReadBandwidth:
    """A kept measurement: gb_s, the buffer and cache sizes it used, when it was measured (ISO date),
    the file that keeps it (None where it could not be written), and whether this call measured it."""

    gb_s: float
    buffer_bytes: int
    cache_bytes: int | None
    measured: str
    path: Path | None
    fresh: bool


def machine_key() -> str:
    """What the figure depends on: the CPU, its count, torch's threads and the kernel level."""
    info = machine_info(torch.device("cpu"))
    return f"{info['device_name']}|cpus={info['cpu_count']}|threads={info['threads']}|{info['cpu_capability']}"


def read_bandwidth(remeasure: bool = False, path: str | Path | None = None) -> ReadBandwidth:
    """This machine's read bandwidth for torch's current thread count: the kept figure, or (the first
    time, or with `remeasure`) a new measurement, which is then kept. An unreadable file counts as
    none; an unwritable one leaves the figure unkept (path None), never the caller without one."""
    path = Path(path) if path is not None else inductor_cache_file(FILE_NAME)  # beside the compile times
    key = machine_key()
    records = read_records(path)
    kept = records.get(key)
    if not remeasure and isinstance(kept, dict) and isinstance(kept.get("gb_s"), (int, float)) and kept["gb_s"] > 0:
        return ReadBandwidth(float(kept["gb_s"]), int(kept.get("buffer_bytes", 0)), kept.get("cache_bytes"),
                             str(kept.get("measured", "")), path, fresh=False)
    cache = last_level_cache_bytes()
    size = buffer_bytes(cache, physical_memory_bytes())
    gb_s = measure_read_bandwidth(size)
    measured = datetime.date.today().isoformat()
    records[key] = {"gb_s": gb_s, "buffer_bytes": size, "cache_bytes": cache, "measured": measured}
    kept_in = path if write_records(path, records) else None
    return ReadBandwidth(gb_s, size, cache, measured, kept_in, fresh=True)


__all__ = ["ReadBandwidth", "buffer_bytes", "last_level_cache_bytes", "measure_read_bandwidth", "read_bandwidth"]
