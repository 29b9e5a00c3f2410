"""The report: a tiny end-to-end run through the command line writes bench.json and bench.md."""

import functools
import json
import shlex

import pytest

import attnres.train.step_cost
from attnres.bench.bench_config import BASELINE, compared_variants
from attnres.bench.report import format_markdown
from attnres.cli import main

RATIO_KEYS = {"train_step", "prefill", "decode_per_token", "peak_memory", "activation_memory",
              "non_activation_memory"}


def test_quick_run_writes_markdown_and_json(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--hidden", "32", "--layers", "2", "--seq-len", "8", "--batch-size", "1",
            "--vocab-size", "64", "--decode-tokens", "2", "--depths", "1,2", "--sweep-hidden", "16",
            "--sweep-seq-len", "8", "--router-batch", "1", "--router-sources", "3", "--warmup", "0",
            "--precision", "fp32", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "bench.json").read_text())
    markdown = (out / "bench.md").read_text()
    assert markdown == format_markdown(results)
    assert "report:" in capsys.readouterr().out

    assert results["command"] == "attnres " + shlex.join(argv)
    assert {"torch", "device", "threads", "cpu_count"} <= set(results["machine"])
    assert results["machine"]["threads"] == 1  # --quick runs on one thread
    assert results["machine"]["read_bandwidth_gb_s"] > 0  # decoding's limit, kept per machine
    if results["machine"]["cpu_allocator"]:  # it moves CPU times, so the report names it (Linux)
        assert f"allocator: {results['machine']['cpu_allocator']}" in markdown
    assert results["config"]["hidden_size"] == 32 and results["config"]["repeats"] == 5

    variants = results["models"]["variants"]
    assert list(variants) == [BASELINE, *compared_variants()]
    for name, row in variants.items():
        assert set(row["ratios"]) == RATIO_KEYS
        assert all(value is not None and value > 0 for value in row["ratios"].values())
        for key in ("train_step_s", "prefill_s", "decode_per_token_s"):
            assert len(row[key]["samples_s"]) == 5
        assert row["memory"]["peak_bytes"] == row["memory"]["activation_bytes"] + row["memory"]["non_activation_bytes"]
        assert f"| {name} |" in markdown
    assert variants[BASELINE]["ratios"]["train_step"] == 1.0
    assert variants["block_attnres"]["model"]["residual_options"]["num_blocks"] == 4  # 8 is invalid for 4 sub-layers

    assert [entry["num_layers"] for entry in results["depth_sweep"]] == [1, 2]
    for entry in results["depth_sweep"]:
        assert list(entry["variants"]) == [BASELINE, *compared_variants()]
        assert all({"train_step", "peak_memory"} <= set(v["ratios"]) for v in entry["variants"].values())

    router = results["router"]
    assert router["n_sources"] == 3 and router["forward"]["fraction_of_copy"] > 0

    for heading in ("## Variants against standard", "## Depth sweep", "## Router micro-benchmark"):
        assert heading in markdown
    assert f"Command: `{results['command']}`" in markdown


def test_variants_subset_and_no_sweep(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--hidden", "16", "--layers", "1", "--seq-len", "4", "--vocab-size", "32",
                 "--decode-tokens", "1", "--depths", "none", "--router-batch", "1", "--warmup", "0",
                 "--variants", "delta_block", "--precision", "fp32", "--out", str(out)]) == 0
    results = json.loads((out / "bench.json").read_text())
    assert list(results["models"]["variants"]) == [BASELINE, "delta_block"]
    assert results["depth_sweep"] == []
    markdown = (out / "bench.md").read_text()
    assert "## Depth sweep" not in markdown


@pytest.mark.compile
def test_compiled_decode_is_timed_beside_eager_decode(tmp_path, monkeypatch):
    # aot_eager traces the same fullgraph step as inductor, without its minutes of code generation.
    monkeypatch.setattr(attnres.train.step_cost, "FastGenerator",
                        functools.partial(attnres.train.step_cost.FastGenerator, backend="aot_eager"))
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--hidden", "16", "--layers", "1", "--seq-len", "4", "--vocab-size", "32",
                 "--decode-tokens", "3", "--depths", "none", "--router-batch", "1", "--warmup", "0",
                 "--variants", "block_attnres", "--precision", "fp32", "--compiled-decode", "--out", str(out)]) == 0
    results = json.loads((out / "bench.json").read_text())
    for name, row in results["models"]["variants"].items():
        assert len(row["decode_compiled_per_token_s"]["samples_s"]) == 5
        assert row["decode_compile_s"] > 0  # compiled once, in the untimed setup (--warmup 0)
        assert row["ratios"]["decode_compiled_per_token"] > 0 and row["compiled_decode_speedup"] > 0
    assert results["models"]["variants"][BASELINE]["ratios"]["decode_compiled_per_token"] == 1.0
    markdown = (out / "bench.md").read_text()
    assert "### Decode: eager and compiled" in markdown and "| block_attnres |" in markdown
