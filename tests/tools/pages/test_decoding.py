"""tools.pages.decoding: the decoding table says which figures are emulated and which tokens differ,
and the first-answer table what a new user's first call decided."""

import copy
import json
from pathlib import Path

from tools.pages import decoding
from tools.pages.render import Context
from tools.pages.sources import Results

ROOT = Path(__file__).resolve().parents[3]


def context_with(tmp_path, results: dict) -> Context:
    target = tmp_path / "results" / decoding.SPEED
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(results))
    return Context(Results(tmp_path), "docs/how-to/generate.md")


def committed() -> dict:
    return json.loads((ROOT / "results" / decoding.SPEED).read_text())


def test_every_variant_and_dtype_gets_a_row_with_its_compile_times(tmp_path):
    results = committed()
    text = decoding.decode_speed(context_with(tmp_path, results))
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| variant")]
    assert len(rows) == 2 * 3 * len(results["decode"])  # a speed table and a costs table
    cold = results["compile"]["block_attnres fp32"]["cold_compile_s"]
    costs = [row for row in rows if row.startswith("| Block AttnRes") and "fp32" in row][1]
    assert f"| {cold:.0f} s / " in costs


def test_a_cpu_without_native_bf16_makes_fp32_binding_and_differing_tokens_are_named(tmp_path):
    results = copy.deepcopy(committed())
    results["machine"]["cpu_native_bf16"] = False
    results["decode"]["bf16"]["attnres full_attnres compiled"]["same_tokens_as_transformers"] = False
    text = decoding.decode_speed(context_with(tmp_path, results))
    assert "bf16 rows are emulated arithmetic and the fp32 rows are the binding ones" in text
    assert "Greedy tokens differ from transformers' for attnres full_attnres compiled (bf16)." in text
    results["machine"]["cpu_native_bf16"] = True
    assert "emulated" not in decoding.decode_speed(context_with(tmp_path / "native", results))


def test_the_first_answer_table_says_what_was_decided(tmp_path):
    results = copy.deepcopy(committed())
    results["first_answer"]["standard"]["compiled"] = True
    text = decoding.first_answer(context_with(tmp_path, results))
    assert "| standard |" in text and "| compiled |" in text
    assert "eager (the compile would not pay)" in text  # the other two, as measured


def test_memory_shares_are_of_the_read_bandwidth_where_a_result_records_it(tmp_path):
    results = copy.deepcopy(committed())
    for key in ("read_bandwidth_gb_s", "read_buffer_bytes"):  # a result as 0.2.0 and before wrote it
        results.pop(key, None)
    old = decoding.decode_speed(context_with(tmp_path / "old", results))
    assert f"against a {results['copy_bandwidth_gb_s']:.1f} GB/s tensor copy" in old and "(of copy)" in old
    results.update(read_bandwidth_gb_s=2 * results["copy_bandwidth_gb_s"], read_buffer_bytes=256 * 2 ** 20)
    text = decoding.decode_speed(context_with(tmp_path / "new", results))
    assert f"this machine's {results['read_bandwidth_gb_s']:.1f} GB/s read bandwidth (a sum over 256 MiB" in text
    assert "(of read)" in text and "(of copy)" not in text
    eager = results["decode"]["fp32"]["attnres standard eager"]
    assert f"{eager['gb_per_s']:.1f} ({eager['gb_per_s'] / results['read_bandwidth_gb_s']:.0%})" in text
