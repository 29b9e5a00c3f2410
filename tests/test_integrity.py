"""Data integrity, end to end, for every command that writes or resumes (issue 59, item 8).

Each test runs a command as a user would, then again, and asserts two invariants: what the record says is
what ran (the settings in config.yaml, state.json, a comparison's records and its results.json are the
ones the optimizer, the tokenizer and the runs used), and a second run loses nothing of the first (a
rerun reuses or refuses; it never rewrites what it did not make, unless asked with --force).
"""

import json

import pytest
import yaml

from attnres.checkpoint import latest_checkpoint
from attnres.cli import main
from attnres.report.folder import MANIFEST
from attnres.train import RunConfig
from attnres.train.metrics import read_metrics
from attnres.train.schedule import lr_factor
from tests.test_bad_inputs import SCALING_PART, _build_world, snapshot


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(tmp_path_factory.mktemp("cache")))
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield _build_world(tmp_path_factory.mktemp("world"))


def run_yaml(world, tmp_path, **train):
    """A copy of the world's run settings with out_dir in tmp_path and `train` changed; its path."""
    run = {**world.run_settings, "out_dir": str(tmp_path / "run"),
           "train": {**world.run_settings["train"], **train}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def test_train_resumed_keeps_the_first_runs_records_and_trains_with_what_it_records(world, tmp_path):
    path = run_yaml(world, tmp_path, steps=4, checkpoint_every=2, eval_every=2, log_every=1)
    assert main(["train", "--config", str(path)]) == 0
    first = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert main(["train", "--config", str(path), "--resume", "--set", "train.steps=6",
                 "--set", "train.lr=0.001"]) == 0
    records = read_metrics(tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[:len(first)] == first  # nothing lost
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert recorded["train"]["lr"] == checkpoint.run_config["train"]["lr"] == 0.001
    config = RunConfig.from_dict(recorded).train  # the logged rate of each resumed step is the recorded schedule's
    for record in (r for r in records if "lr" in r and r["step"] > 4):
        assert record["lr"] == pytest.approx(0.001 * lr_factor(record["step"] - 1, config), rel=1e-9)


def test_finetune_records_the_model_and_tokenizer_it_trained_from(world, tmp_path):
    out = tmp_path / "ft"
    assert main(["finetune", str(world.converted), "--set", f"out_dir={out}", "--set", f"data.source={world.corpus}",
                 "--set", "train.seq_len=16", "--set", "train.batch_size=2", "--set", "train.steps=2"]) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["init_from"] == recorded["data"]["tokenizer"] == str(world.converted)
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (world.converted / "tokenizer.json").read_bytes()
    before = snapshot(out)
    assert main(["finetune", str(world.converted), "--set", f"out_dir={out}", "--set", f"data.source={world.corpus}",
                 "--set", "train.seq_len=16", "--set", "train.batch_size=2", "--set", "train.steps=2"]) == 1
    assert snapshot(out) == before  # a second finetune into the same out_dir is refused


def test_compare_rerun_reuses_every_run_and_refuses_other_settings(world, tmp_path):
    out = tmp_path / "compare"
    argv = ["compare", "--preset", str(world.compare_preset), "--out", str(out)]
    assert main(argv) == 0
    records = {p: p.read_bytes() for p in out.rglob("compare_record.json")}
    assert len(records) == 2
    results = json.loads((out / "results.json").read_text())
    for path in records:  # the report's settings are those each run trained with
        run = json.loads(path.read_text())["run"]
        assert run["train"]["lr"] == results["settings"]["train"]["lr"]
        assert run["train"]["steps"] == results["settings"]["train"]["steps"]
    assert main(argv) == 0
    assert {p: p.read_bytes() for p in out.rglob("compare_record.json")} == records  # nothing retrained or lost
    before = snapshot(out)
    assert main([*argv, "--set", "run.train.lr=0.05"]) == 2
    assert snapshot(out) == before
    assert json.loads((out / MANIFEST).read_text())["command"] == "compare"


def test_scaling_rerun_reuses_every_run(world, tmp_path):
    out = tmp_path / "scaling"
    argv = ["scaling", "--preset", str(world.scaling_preset), *SCALING_PART, "--out", str(out)]
    assert main(argv) == 0
    records = {p: p.read_bytes() for p in out.rglob("scaling_record.json")}
    assert records
    assert main(argv) == 0
    assert {p: p.read_bytes() for p in out.rglob("scaling_record.json")} == records


def test_bench_rerun_is_refused_and_force_replaces_the_report(world, tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--variants", "block_attnres", "--depths", "none", "--out", str(out)]
    assert main(argv) == 0
    before = snapshot(out)
    assert main(argv) == 2
    assert snapshot(out) == before  # the earlier timings are kept
    assert main([*argv, "--force"]) == 0
    assert json.loads((out / "bench.json").read_text())["command"].endswith("--force")


def test_analyze_rerun_rewrites_only_the_same_report(world, tmp_path):
    out = tmp_path / "analyze"
    argv = ["analyze", str(world.run), "--out", str(out), "--max-batches", "1"]
    assert main(argv) == 0
    first = json.loads((out / "analysis.json").read_text())
    assert main(argv) == 0
    again = json.loads((out / "analysis.json").read_text())
    assert {k: v for k, v in again.items() if k != "created"} == {k: v for k, v in first.items() if k != "created"}
    before = snapshot(out)
    assert main(["analyze", str(world.run), "--out", str(out), "--max-batches", "2"]) == 2
    assert snapshot(out) == before


def test_convert_into_its_own_output_again_is_refused(world, tmp_path, capsys):
    out = tmp_path / "converted"
    assert main(["convert", str(world.llama), "--out", str(out)]) == 0
    before = snapshot(out)
    assert main(["convert", str(world.llama), "--out", str(out)]) == 2
    assert snapshot(out) == before
    assert json.loads((out / "config.json").read_text())["residual"] == "standard"  # what the command was asked
