"""What a measurement records about its machine: the allocator, which moves CPU times."""

import sys

import pytest
import torch

from attnres.common.machine import machine_info, memory_allocator

MAPS = """\
55d0c1a00000-55d0c1a01000 r--p 00000000 08:01 123 /usr/bin/python3.11
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0
7f1e2d200000-7f1e2d228000 r--p 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
"""


@pytest.mark.parametrize("library, name", [
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10", "tcmalloc"),
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "tcmalloc"),
    ("/opt/conda/lib/libjemalloc.so.2", "jemalloc"),
    ("/usr/local/lib/libmimalloc.so.2.1", "mimalloc"),
])
def test_a_mapped_allocator_is_named(library, name):
    line = f"7f1e2e000000-7f1e2e010000 r-xp 00000000 08:01 789 {library}\n"
    assert memory_allocator(MAPS + line) == name


def test_without_one_it_is_the_c_librarys():
    assert memory_allocator(MAPS) == "libc"
    # A path that merely contains an allocator's name is not that allocator.
    assert memory_allocator(MAPS + "7f-7f r--p 0 08:01 9 /home/libjemalloc-notes/data.bin\n") == "libc"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_every_cpu_record_names_this_process_allocator():
    recorded = machine_info(torch.device("cpu"))["cpu_allocator"]
    assert recorded == memory_allocator() and recorded in {"libc", "tcmalloc", "jemalloc", "mimalloc"}
