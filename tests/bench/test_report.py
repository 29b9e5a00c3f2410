"""The report: targets met / missed, and a tiny end-to-end run through the command line."""

import json
import shlex

from attnres.bench.config import BASELINE, VARIANTS, resolve_config
from attnres.bench.report import format_markdown
from attnres.bench.targets import TARGETS, condition_mismatches, evaluate_targets
from attnres.cli import main

RATIO_KEYS = {"train_step", "prefill", "decode_per_token", "peak_memory", "activation_memory",
              "non_activation_memory"}


def _models(**ratios):
    return {"variants": {name: {"ratios": r} for name, r in ratios.items()}}


def test_targets_met_missed_and_not_measured():
    models = _models(block_attnres={"train_step": 1.05, "peak_memory": 1.2, "decode_per_token": 1.0},
                     full_attnres={"train_step": 1.3, "peak_memory": 1.49})
    rows = {(r["variant"], r["metric"]): r for r in evaluate_targets(models, {"forward": {"fraction_of_copy": 0.5}})}
    assert len(rows) == len(TARGETS)
    assert rows["block_attnres", "train_step"]["status"] == "met"  # the limit itself is met
    assert rows["block_attnres", "peak_memory"]["status"] == "missed"
    assert rows["block_attnres", "decode_per_token"]["status"] == "met"
    assert rows["full_attnres", "train_step"]["status"] == "missed"
    assert rows["full_attnres", "peak_memory"] == {"target": "Full AttnRes peak memory / standard",
                                                   "variant": "full_attnres", "metric": "peak_memory", "op": "<=",
                                                   "limit": 1.5, "measured": 1.49, "status": "met"}
    assert rows["delta_block", "train_step"]["status"] == "not measured"
    assert rows["router", "fraction_of_copy"]["status"] == "met"
    assert evaluate_targets(None, None)[-1]["status"] == "not measured"


def test_condition_mismatches():
    assert condition_mismatches(resolve_config()) == []
    assert condition_mismatches(resolve_config(hidden_size=512)) == []
    assert condition_mismatches(resolve_config(precision="fp32", num_layers=12)) == [
        "precision fp32 (targets: bf16)", "12 layers (targets: 24)"]


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
    assert results["config"]["hidden_size"] == 32 and results["config"]["repeats"] == 5

    variants = results["models"]["variants"]
    assert list(variants) == [BASELINE, *VARIANTS]
    for name, row in variants.items():
        assert set(row["ratios"]) == RATIO_KEYS
        assert all(value is not None and value > 0 for value in row["ratios"].values())
        for key in ("train_step_s", "prefill_s", "decode_per_token_s"):
            assert len(row[key]["samples_s"]) == 5
        assert row["memory"]["peak_bytes"] == row["memory"]["activation_bytes"] + row["memory"]["non_activation_bytes"]
        assert f"| {name} |" in markdown
    assert variants[BASELINE]["ratios"]["train_step"] == 1.0
    assert variants["block_attnres"]["model"]["num_blocks"] == 4  # 8 is invalid for 4 sub-layers

    assert [entry["num_layers"] for entry in results["depth_sweep"]] == [1, 2]
    for entry in results["depth_sweep"]:
        assert list(entry["variants"]) == [BASELINE, *VARIANTS]
        assert all({"train_step", "peak_memory"} <= set(v["ratios"]) for v in entry["variants"].values())

    router = results["router"]
    assert router["n_sources"] == 3 and router["forward"]["fraction_of_copy"] > 0

    assert [t["target"] for t in results["targets"]] == [t.label for t in TARGETS]
    assert all(t["status"] in ("met", "missed") for t in results["targets"])
    for heading in ("## Variants against standard", "## Depth sweep", "## Router micro-benchmark", "## Targets",
                    "| target | limit | measured | status |", "this run differs"):
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
    statuses = {t["variant"]: t["status"] for t in results["targets"] if t["metric"] == "train_step"}
    assert statuses["full_attnres"] == "not measured" and statuses["delta_block"] in ("met", "missed")
    markdown = (out / "bench.md").read_text()
    assert "## Depth sweep" not in markdown and "not measured" in markdown
