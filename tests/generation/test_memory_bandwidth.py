"""The read-bandwidth limit (attnres.generation.memory_bandwidth): a buffer well beyond the last-level
cache, so that it measures memory, and one figure per machine, kept, so that runs agree."""

from __future__ import annotations

import math

import pytest

from attnres.generation import memory_bandwidth
from attnres.generation.memory_bandwidth import (LLC_MULTIPLE, MIN_BUFFER_BYTES, buffer_bytes, last_level_cache_bytes,
                                                 measure_read_bandwidth, physical_memory_bytes, read_bandwidth)


def _cache_tree(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    return root


def test_the_last_level_cache_is_the_largest_data_or_unified_cache(tmp_path):
    tree = _cache_tree(tmp_path / "cache", [(1, "Data", "32K"), (1, "Instruction", "64K"), (2, "Unified", "512K"),
                                            (3, "Unified", "32768K")])
    assert last_level_cache_bytes(tree) == 32 * 2 ** 20
    assert last_level_cache_bytes(_cache_tree(tmp_path / "other", [(1, "Instruction", "1M")])) is None
    assert last_level_cache_bytes(tmp_path / "absent") is None


def test_the_buffer_is_several_times_the_cache_this_machine_reports():
    cache, memory = last_level_cache_bytes(), physical_memory_bytes()
    size = buffer_bytes(cache, memory)
    assert size >= MIN_BUFFER_BYTES or (memory is not None and size == memory // 8)
    if cache is not None and (memory is None or LLC_MULTIPLE * cache <= memory // 8):
        assert size >= LLC_MULTIPLE * cache


def test_the_buffer_rule():
    assert buffer_bytes(None) == MIN_BUFFER_BYTES
    assert buffer_bytes(256 * 2 ** 20) == LLC_MULTIPLE * 256 * 2 ** 20
    assert buffer_bytes(256 * 2 ** 20, memory_bytes=8 * 2 ** 30) == 2 ** 30  # at most an eighth of memory


def test_a_measurement_is_a_positive_rate():
    rate = measure_read_bandwidth(8 * 2 ** 20, repeats=3)
    assert math.isfinite(rate) and rate > 0


def test_the_figure_is_measured_once_kept_and_measured_again_on_request(tmp_path, monkeypatch):
    rates = iter([20.0, 30.0])
    monkeypatch.setattr(memory_bandwidth, "measure_read_bandwidth", lambda nbytes: next(rates))
    path = tmp_path / "kept.json"
    first = read_bandwidth(path=path)
    assert (first.gb_s, first.fresh, first.path) == (20.0, True, path)
    assert first.buffer_bytes == buffer_bytes(last_level_cache_bytes(), physical_memory_bytes())
    again = read_bandwidth(path=path)
    assert (again.gb_s, again.fresh, again.measured) == (20.0, False, first.measured)
    renewed = read_bandwidth(remeasure=True, path=path)
    assert (renewed.gb_s, renewed.fresh) == (30.0, True)
    assert read_bandwidth(path=path).gb_s == 30.0
    with pytest.raises(StopIteration):
        read_bandwidth(remeasure=True, path=path)  # (the fake has no third figure: it was not called before)


def test_an_unreadable_or_unwritable_file_costs_a_measurement_not_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_bandwidth, "measure_read_bandwidth", lambda nbytes: 12.5)
    broken = tmp_path / "broken.json"
    broken.write_text("{torn")
    assert read_bandwidth(path=broken).gb_s == 12.5
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unkept = read_bandwidth(path=blocked / "kept.json")  # its folder is a file
    assert (unkept.gb_s, unkept.path, unkept.fresh) == (12.5, None, True)
