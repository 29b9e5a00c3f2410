"""The fair-comparison protocol end to end: search, choice, final runs on the test split, reuse, shards."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import attnres.compare.run_comparison as compare_run
import attnres.compare.tune as tune
import attnres.train.trainer as trainer
from attnres.cli import main
from attnres.compare.presets import load_preset
from attnres.compare.tune import rate_run, run_protocol
from attnres.train import RunConfigError
from tests.report.test_plots import assert_legible

TINY = {
    "description": "two variants, a two-rate search, two final seeds, a few steps",
    "protocol": {"lr_grid": [3e-3, 1.2e-2], "grid_seeds": 1, "max_extensions": 1},
    "seeds": 2,
    "variants": [{"residual": "standard"}, {"residual": "block_attnres", "num_blocks": 2}],
    "run": {"model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                      "intermediate_size": 32, "max_seq_len": 32},
            "data": {"source": "demo", "tokenizer": "bpe", "vocab_size": 300, "max_documents": 60,
                     "val_fraction": 0.1, "test_fraction": 0.1},
            "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 1,
                      "eval_every": 2, "eval_batches": 1, "checkpoint_every": 4, "keep_checkpoints": 1,
                      "tensorboard": False, "progress": False, "precision": "fp32"}},
}


def write_preset(tmp_path, **changes) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **changes}))
    return str(path)


@pytest.fixture
def preset(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    return load_preset(write_preset(tmp_path))


def count_training(monkeypatch) -> list[str]:
    trained, real_train = [], compare_run.train
    monkeypatch.setattr(compare_run, "train", lambda run, **kw: trained.append(run.out_dir) or real_train(run, **kw))
    return trained


def chosen(results) -> dict:
    return {v["name"]: v["chosen_lr"] for v in results["variants"]}


def test_a_study_searches_chooses_reports_on_test_and_reruns_without_training(preset, tmp_path, monkeypatch):
    trained = count_training(monkeypatch)
    out = tmp_path / "fair"
    results = run_protocol(preset, out, log=lambda *_: None)
    for variant in results["variants"]:
        searched = [g["lr"] for g in variant["grid"]]
        assert searched[:2] == [3e-3, 1.2e-2] or searched[1:] == [3e-3, 1.2e-2]  # extended by one at most
        best = min(variant["grid"], key=lambda g: g["mean_val_loss"])["lr"]
        assert variant["chosen_lr"] == best
        assert [r["seed"] for r in variant["runs"]] == [0, 1] and all(r["lr"] == best for r in variant["runs"])
        assert all(np.isfinite(r["final_test_loss"]) and r["final_test_loss"] != r["final_val_loss"]
                   for r in variant["runs"])
    # the search's seed 0 at the chosen rate is a final run: searched rates x 1 seed + 1 more seed per variant
    assert len(trained) == sum(len(v["grid"]) + 1 for v in results["variants"])
    run = rate_run(preset, preset.variants[0], 1.2e-2, 0, out)
    assert (run.train.lr, run.train.min_lr) == (1.2e-2, 1.2e-3)  # min_lr keeps the preset's ratio
    report = (out / "report.md").read_text()
    assert "Learning-rate search" in report and "test split" in report and (out / "figures/lr_search.png").is_file()
    assert "the chosen rate's in bold" in report  # the argmin is a searched rate
    trained.clear()
    again = run_protocol(preset, out, log=lambda *_: None)
    assert trained == [] and chosen(again) == chosen(results)
    assert json.loads((out / "results.json").read_text())["summary"]["standard"]["seeds"] == [0, 1]


def test_other_test_documents_change_no_choice_and_no_training(preset, tmp_path, monkeypatch):
    first = run_protocol(preset, tmp_path / "a", log=lambda *_: None)
    real_prepare = trainer.prepare_data

    def other_test_split(config, run_dir=None):  # the same data, a different test split
        data = real_prepare(config, run_dir)
        data.test_tokens = np.ascontiguousarray(data.test_tokens[::-1])
        return data

    monkeypatch.setattr(trainer, "prepare_data", other_test_split)
    second = run_protocol(preset, tmp_path / "b", log=lambda *_: None)
    assert chosen(second) == chosen(first)
    for a, b in zip(first["variants"], second["variants"]):
        assert [g["val_losses"] for g in a["grid"]] == [g["val_losses"] for g in b["grid"]]
        assert [r["final_val_loss"] for r in a["runs"]] == [r["final_val_loss"] for r in b["runs"]]
        assert [r["final_test_loss"] for r in a["runs"]] != [r["final_test_loss"] for r in b["runs"]]


def test_a_protocol_needs_a_test_split(tmp_path, monkeypatch):
    run = {**TINY["run"], "data": {**TINY["run"]["data"], "test_fraction": 0.0}}
    with pytest.raises(RunConfigError, match="reports on a test split; set run.data.test_fraction"):
        load_preset(write_preset(tmp_path, run=run))


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "attnres", "compare", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_command_refuses_a_grid_of_one_rate_in_one_line(tmp_path, monkeypatch):
    result = cli("--preset", write_preset(tmp_path), "--set", "protocol.lr_grid=[3.0e-3]", "--out", "o", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "protocol.lr_grid needs at least 2 distinct rates to choose from, got [0.003]")


def test_shards_split_the_seeds_and_wait_for_each_other(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    path = write_preset(tmp_path, protocol={**TINY["protocol"], "grid_seeds": 2})
    shards = [subprocess.Popen([sys.executable, "-m", "attnres", "compare", "--preset", path, "--out", "o",
                                "--shard", f"{i}/2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) for i in range(2)]
    logs = [shard.communicate(timeout=600)[0] for shard in shards]
    assert [shard.returncode for shard in shards] == [0, 0], logs
    for i, log in enumerate(logs):  # shard i trained only seeds i mod 2
        trained = [line for line in log.splitlines() if ": training 4 steps" in line]
        assert trained and all(line.split(": training")[0].endswith(f"seed {i}") for line in trained)
    assert not (tmp_path / "o" / "report.md").exists()
    result = cli("--preset", path, "--out", "o", cwd=tmp_path)
    assert result.returncode == 0 and "training 4 steps" not in result.stdout + result.stderr
    assert (tmp_path / "o" / "report.md").is_file()


def test_the_bundled_smoke_protocol_runs_from_the_command_line(tmp_path, monkeypatch, captured_figures):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "smoke"
    assert main(["compare", "--preset", "fair_smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"]["final_seeds"] == 2 and results["settings"]["data"]["test_fraction"] == 0.1
    assert all(len(v["runs"]) == 2 for v in results["variants"])
    assert_legible("lr_search.png", captured_figures["lr_search.png"])
    assert "tied" in results["summary"]["standard"]


def test_a_later_study_takes_each_variants_rate_from_a_finished_search(preset, tmp_path, monkeypatch):
    searched = run_protocol(preset, tmp_path / "fair", log=lambda *_: None)
    later = {**TINY, "run": {**TINY["run"], "train": {**TINY["run"]["train"], "steps": 6}}, "seeds": 1,
             "rates_from": str(tmp_path / "fair"), "cost": {"repeats": 5, "warmup": 0}}
    del later["protocol"]
    path = tmp_path / "later.yaml"
    path.write_text(yaml.safe_dump(later))
    loaded = load_preset(str(path))
    assert loaded.rates == chosen(searched)
    run = loaded.run_of(loaded.variants[1], 0, "x")
    assert run.train.lr == chosen(searched)["block_attnres (N=2)"] and run.train.min_lr == pytest.approx(run.train.lr / 10)
    results = compare_run.run_compare(loaded, tmp_path / "later", log=lambda *_: None)
    assert results["rates"] == chosen(searched) and "chosen by the learning-rate search" in (
        tmp_path / "later" / "report.md").read_text()
    assert all("final_test_loss" in v["runs"][0] for v in results["variants"])  # the data's test split, reported
    path.write_text(yaml.safe_dump({**later, "rates_from": str(tmp_path / "nowhere")}))
    with pytest.raises(RunConfigError, match="rates_from .*nowhere.*cannot read .*run that study first"):
        load_preset(str(path))
    path.write_text(yaml.safe_dump({**later, "variants": [{"residual": "standard"}, {"residual": "mhc"}]}))
    with pytest.raises(RunConfigError, match=r"chose no rate for \['mhc'\]"):
        load_preset(str(path))


@pytest.mark.parametrize("name, runner", [("smoke", "run_compare"), ("fair_dense", "run_protocol")])
def test_run_preset_takes_the_protocol_where_the_preset_has_one(name, runner, tmp_path, monkeypatch):
    import attnres.compare.tune as tune
    from attnres.compare import load_preset, run_preset

    calls = []
    for function in ("run_compare", "run_protocol"):
        monkeypatch.setattr(tune, function, lambda preset, out, _name=function, **options:
                            calls.append((_name, preset.name, out, options)) or {"ran": _name})
    preset = load_preset(name)
    assert run_preset(preset, tmp_path, seeds=1, device="cpu") == {"ran": runner}
    assert calls == [(runner, preset.name, tmp_path, {"seeds": 1, "device": "cpu"})]


def test_the_fitted_protocol_runs_end_to_end_with_fresh_final_seeds(tmp_path, monkeypatch):
    # the protocol of docs/explanation/protocol.md in miniature: three rates, a fitted choice, final seeds
    # from 1000 (3 for the primary variant, 2 for the secondary), the failure threshold recorded
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    protocol = {"lr_grid": [3e-3, 6e-3, 1.2e-2], "grid_seeds": 1, "max_extensions": 0, "choice": "fit",
                "final_seed_start": 1000, "primary": ["standard"], "secondary_seeds": 2}
    preset = load_preset(write_preset(tmp_path, protocol=protocol, seeds=3))
    entropy = tune.failure_threshold(preset)
    assert 0 < entropy < np.log(300)  # the training split's unigram entropy, below a uniform guess's loss
    # four steps learn less than token frequencies, so every run would count as failed: raise the bar here
    monkeypatch.setattr(tune, "failure_threshold", lambda preset: 50.0)
    trained = count_training(monkeypatch)
    results = run_protocol(preset, tmp_path / "fit", log=lambda *_: None)
    standard, block = results["variants"]
    assert [r["seed"] for r in standard["runs"]] == [1000, 1001, 1002]
    assert [r["seed"] for r in block["runs"]] == [1000, 1001]
    assert standard["primary"] and not block["primary"]
    for variant in results["variants"]:
        fit = variant["fit"]
        assert fit["window"] == [3e-3, 6e-3, 1.2e-2] and fit["highest_stable"] in (6e-3, 1.2e-2, 3e-3)
        assert variant["chosen_lr"] == fit["rate"] and all(r["lr"] == fit["rate"] for r in variant["runs"])
        assert all(r["tail_train_loss"] is not None for r in variant["runs"])
    assert results["protocol"]["failure_threshold"] == 50.0
    assert results["tokens"]["per_run"] == 4 * 2 * 32
    assert len(trained) == 3 + 3 + 3 + 2  # the grid of both, then the final runs, none reused
    assert not any("/seed1" in t and "/seed100" not in t for t in trained)  # grid seeds are 0 only
    report = (tmp_path / "fit" / "report.md").read_text()
    assert "## Fitted rates" in report and "## Tests" in report and "Holm p" in report
    assert "in bold" not in report and "'chosen': the fitted rate" in report  # a vertex, between searched rates
    assert "Each run reads 256 tokens of a" in report and "minus final validation loss" in report
    standard_tokens = 256 / standard["parameters"]
    assert f"That is {standard_tokens:.2f} tokens per parameter" in report  # both round alike here
    saved = json.loads((tmp_path / "fit" / "results.json").read_text())
    assert saved["analysis"]["contrasts"]["block_attnres"]["family"] == "secondary"
    # the equal-time ratio's measurement: every variant's training step, as its final runs trained, interleaved
    cost = saved["cost"]
    assert list(cost["variants"]) == ["standard", "block_attnres (N=2)"]
    assert all(len(v["train_step_s"]["samples_s"]) == cost["settings"]["repeats"] for v in cost["variants"].values())
    assert cost["variants"]["block_attnres (N=2)"]["model"]["residual_options"]["num_blocks"] == 2
    assert saved["summary"]["block_attnres (N=2)"]["step_time_ratio"] > 0 and "## Cost" in report


def test_seed_start_pairs_a_comparison_with_a_protocols_final_seeds(tmp_path, monkeypatch):
    # the equal-time arm: standard alone, longer, on the protocol's final seeds (1000 on)
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    values = {k: v for k, v in TINY.items() if k != "protocol"}
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump({**values, "seed_start": 1000, "variants": [{"residual": "standard"}]}))
    preset = load_preset(str(path))
    results = compare_run.run_compare(preset, tmp_path / "arm", log=lambda *_: None)
    assert results["seeds"] == [1000, 1001] and [r["seed"] for r in results["variants"][0]["runs"]] == [1000, 1001]
    with pytest.raises(RunConfigError, match="seed_start is for a comparison without a protocol"):
        load_preset(write_preset(tmp_path, seed_start=1000))
