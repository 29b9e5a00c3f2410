"""`attnres scaling` end to end on tiny presets: trains every run, fits, writes every report file;
reuses finished runs, splits work into shards, and launches runs as `attnres train` child processes."""

import json
import shlex
import sys

import pytest
import yaml

import attnres.scaling.sweep as sweep
from attnres.cli import main
from attnres.scaling.preset import load_preset
from attnres.scaling.sweep import RECORD_FILE, run_sweep
from attnres.train import RunConfigError
from attnres.train.metrics import read_metrics

REPORT_FILES = ("results.json", "report.md", "index.html", "figures/loss_vs_compute.png",
                "figures/compute_advantage.png", "figures/loss_vs_parameters.png")
TWO_SIZES = {
    "description": "two sizes, two variants, a few steps each",
    "variants": [{"residual": "standard"}, {"residual": "delta_block", "num_blocks": 2}],
    "sizes": [{"hidden_size": 16, "num_layers": 2}, {"hidden_size": 24, "num_layers": 2}],
    "rules": {"head_dim": 8, "kv_groups": 2, "ffn_ratio": 2, "ffn_multiple": 8, "tokens_per_parameter": 0.1,
              "evaluations": 1},
    "run": {"model": {"max_seq_len": 16},
            "data": {"source": "demo", "tokenizer": "bpe", "vocab_size": 300, "max_documents": 40, "val_fraction": 0.1},
            "train": {"batch_size": 2, "seq_len": 16, "eval_batches": 1, "tensorboard": False, "progress": False,
                      "precision": "fp32"}},
}


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """One data cache for the module: the demo corpus (two Debian packages) fetched once, not per test."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def cache(data_cache, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(data_cache))


def count_training(monkeypatch) -> list[str]:
    trained = []
    real_train = sweep.train

    def counting_train(run, resume=False, **kwargs):
        trained.append(run.out_dir)
        return real_train(run, resume=resume, **kwargs)

    monkeypatch.setattr(sweep, "train", counting_train)
    return trained


def test_tiny_preset_runs_end_to_end_and_writes_every_report_file(tmp_path, monkeypatch, capsys):
    trained = count_training(monkeypatch)
    out = tmp_path / "sweep"
    assert main(["scaling", "--preset", "tiny", "--out", str(out), "--replicates", "50"]) == 0
    assert "report:" in capsys.readouterr().out
    for name in REPORT_FILES:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    preset = load_preset("tiny")
    assert len(trained) == 12  # 5 sizes x 2 variants + a second seed of both at the smallest size
    assert [s["name"] for s in results["sizes"]] == ["d16-l2", "d24-l2", "d32-l2", "d32-l4", "d48-l4"]
    assert [v["name"] for v in results["variants"]] == ["standard", "block_attnres (N=4)"]
    for variant in results["variants"]:
        assert len(variant["runs"]) == 6
        for run in variant["runs"]:  # the record's loss is the one the run logged at its last step
            metrics = read_metrics(run["run_dir"])
            assert run["final_val_loss"] == [r for r in metrics if "val_loss" in r][-1]["val_loss"]
            assert metrics[-1]["step"] * 4 * 32 == run["tokens"]
    assert set(results["fit"]["laws"]) == {"saturating", "power"}
    assert len(preset.sizes) == 5
    # the step time of every variant at the largest size, measured interleaved after training
    assert results["cost_size"] == "d48-l4"
    assert list(results["cost"]["variants"]) == ["standard", "block_attnres (N=4)"]
    assert len(results["cost"]["variants"]["standard"]["train_step_s"]["samples_s"]) == 11
    assert "## Measured step time and the advantage in wall-clock time" in (out / "report.md").read_text()

    # a second call trains nothing and writes the same fit
    trained.clear()
    assert main(["scaling", "--preset", "tiny", "--out", str(out), "--replicates", "50"]) == 0
    assert trained == []
    again = json.loads((out / "results.json").read_text())
    assert again["fit"] == results["fit"]


def test_shards_split_the_runs_and_a_last_call_reports(tmp_path, monkeypatch):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(TWO_SIZES))
    preset = load_preset(str(path))
    out = tmp_path / "sweep"
    trained = count_training(monkeypatch)
    assert run_sweep(preset, out, shard=(0, 2), replicates=20, log=lambda *_: None) is None
    first = list(trained)
    assert run_sweep(preset, out, shard=(1, 2), replicates=20, log=lambda *_: None) is None
    second = trained[len(first):]
    assert first and second and not set(first) & set(second)
    assert not (out / "results.json").exists()  # shards write no report
    trained.clear()
    lines = []
    results = run_sweep(preset, out, replicates=20, cost_repeats=0, log=lines.append)
    assert trained == [] and "cost" not in results
    assert lines[0] == "scaling: 4 run(s), 4 finished earlier; 0 step(s) to train"
    assert sum(len(v["runs"]) for v in results["variants"]) == 4
    # two sizes cannot pin a three-parameter law: refused, never invented
    for name, entry in results["fit"]["laws"]["saturating"].items():
        assert entry["fit"] is None and "needs at least" in entry["error"], name
    assert all(entry["fit"] is not None for entry in results["fit"]["laws"]["power"].values())


def test_launcher_trains_through_attnres_train_in_a_child_process(tmp_path, monkeypatch):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({**TWO_SIZES, "variants": [{"residual": "standard"}]}))
    out = tmp_path / "sweep"
    monkeypatch.setattr(sweep, "train", lambda *a, **k: pytest.fail("trained in this process"))
    results = run_sweep(load_preset(str(path)), out, launcher=shlex.quote(sys.executable), replicates=20,
                        cost_repeats=0, log=lambda *_: None)
    runs = results["variants"][0]["runs"]
    assert len(runs) == 2
    for run in runs:
        folder = out / "runs" / run["size"] / "standard" / "seed0"
        assert (folder / RECORD_FILE).is_file() and (folder / "config.yaml").is_file()
        assert yaml.safe_load((folder / "config.yaml").read_text())["out_dir"] == str(folder)


def test_a_failed_child_run_stops_the_sweep_with_its_command(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(TWO_SIZES))
    with pytest.raises(sweep.TrainingError, match="exited with"):
        run_sweep(load_preset(str(path)), tmp_path / "sweep", launcher="false", log=lambda *_: None)


def test_a_folder_of_other_settings_is_refused(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(TWO_SIZES))
    out = tmp_path / "sweep"
    run_sweep(load_preset(str(path)), out, shard=(0, 2), log=lambda *_: None)
    with pytest.raises(RunConfigError, match="other settings"):
        run_sweep(load_preset(str(path), ["train.lr=1e-2"]), out, shard=(0, 2), log=lambda *_: None)


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({**TWO_SIZES, "variants": [{"residual": "standard"}]}))
    preset = load_preset(str(path))
    out = tmp_path / "sweep"
    calls = []
    real_train = sweep.train

    def stop_after_half(run, resume=False, on_step=None, **kwargs):
        calls.append(resume)
        if len(calls) == 1:  # the first run stops right after its halfway checkpoint
            def step(record):
                if record["step"] == run.train.checkpoint_every:
                    raise KeyboardInterrupt
            return real_train(run, resume=resume, on_step=step, **kwargs)
        return real_train(run, resume=resume, on_step=on_step, **kwargs)

    monkeypatch.setattr(sweep, "train", stop_after_half)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(preset, out, replicates=20, cost_repeats=0, log=lambda *_: None)
    results = run_sweep(preset, out, replicates=20, cost_repeats=0, log=lambda *_: None)
    assert calls == [False, True, False]  # the interrupted run resumed, the other started fresh
    assert len(results["variants"][0]["runs"]) == 2


def test_bad_cost_repeats_fail_before_any_training(tmp_path, monkeypatch):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(TWO_SIZES))
    monkeypatch.setattr(sweep, "train", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(ValueError, match=r"--cost-repeats\) must be 0 .* or an integer >= 5, got 3"):
        run_sweep(load_preset(str(path)), tmp_path / "sweep", cost_repeats=3, log=lambda *_: None)
