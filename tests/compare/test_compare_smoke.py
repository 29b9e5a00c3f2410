"""`attnres compare --preset smoke`: trains every variant on the demo corpus and writes every report file."""

import json

import matplotlib.image
import pytest

from attnres.cli import main
from attnres.compare.presets import available_presets, load_preset
from attnres.model.model_config import RESIDUALS
from attnres.report.plots import figure_legend
from attnres.train import RunConfigError
from tests.report.test_plots import assert_legible

VARIANTS = ["standard", "full_attnres", "block_attnres", "delta_attnres", "delta_block"]
SMOKE_VARIANTS = VARIANTS + ["mhc"]  # the smoke preset also runs one contender (method §7)


def test_smoke_compare_writes_every_report_file(tmp_path, monkeypatch, captured_figures):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    assert main(["compare", "--preset", "smoke", "--out", str(out)]) == 0
    for name in ("report.md", "index.html", "results.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 500
    results = json.loads((out / "results.json").read_text())
    assert [v["residual"] for v in results["variants"]] == SMOKE_VARIANTS
    for variant in results["variants"]:
        run = variant["runs"][0]
        assert 0 < run["final_val_loss"] < 10 and run["step_time_s"] > 0
        assert len(run["val_curve"]) == 4  # eval every 10 of 40 steps
        events = run["stability"]  # the run's totals from its metrics.jsonl
        assert events["steps"] == 40 and 0.0 <= events["clip_rate"] <= 1.0
        assert events["clip_rate"] == pytest.approx(events["clipped_steps"] / 40)
    # the cost: every variant measured in this process after training, the preset's rounds
    cost = results["cost"]
    assert list(cost["variants"]) == [v["name"] for v in results["variants"]]  # standard first
    assert cost["settings"]["repeats"] == 5 and cost["settings"]["routing"] == results["code_path"]["routing"]
    for name, measured in cost["variants"].items():
        assert len(measured["train_step_s"]["samples_s"]) == 5 and measured["memory"]["peak_bytes"] > 0, name
    summary = results["summary"]
    assert summary["standard"]["step_time_ratio"] == 1.0 and summary["standard"]["step_time_noisy"] is False
    assert all(summary[n]["step_time_low"] <= summary[n]["step_time_ratio"] <= summary[n]["step_time_high"]
               for n in summary)
    assert summary["full_attnres"]["peak_memory_ratio"] > 1.0  # a router per sub-layer: more parameters
    report = (out / "report.md").read_text()
    html = (out / "index.html").read_text()
    # what one seed can show, the headline rule on its own data, and the command that runs the protocol
    assert results["headline"] == {"seeds": 1, "loss": "final_val_loss", "survives": [], "recommended": [],
                                   "protocol": "tools/studies/protocol.sh protocol_dense"}
    assert "## What these seeds can show" in report and "**1 seed per variant.**" in report
    assert "it recommends no variant from this run" in report and "tools/studies/protocol.sh protocol_dense" in report
    expected_pngs = {"val_loss.png", "cost.png", "max_weight_by_depth.png", "hidden_rms_by_depth.png",
                     "routing_full_attnres.png", "routing_block_attnres-N-4.png", "routing_delta_attnres.png",
                     "routing_delta_block-N-4.png", "routing_mhc.png"}
    written = {p.name for p in (out / "figures").glob("*.png")}
    assert {n.lower() for n in written} == {n.lower() for n in expected_pngs}
    for name in written:
        assert f"figures/{name}" in report and f"figures/{name}" in html
        image = matplotlib.image.imread(out / "figures" / name)
        assert image.shape[0] >= 300 and image.shape[1] >= 400
    # a person can read them: every figure has a title and labelled axes; multi-series ones a legend
    assert set(captured_figures) == written
    for name, fig in captured_figures.items():
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), name
        if name in ("val_loss.png", "max_weight_by_depth.png", "hidden_rms_by_depth.png"):
            assert figure_legend(fig) is not None, name
        assert_legible(name, fig)
    for variant in SMOKE_VARIANTS:
        assert f"| {variant}" in report
    assert "## Training stability" in report and "Training stability" in html
    assert summary["standard"]["clip_rate_mean"] == results["variants"][0]["runs"][0]["stability"]["clip_rate"]


def test_presets_are_listed_and_validated():
    assert {"smoke", "default"} <= set(available_presets())
    preset = load_preset("default")
    assert preset.run["model"]["num_layers"] >= 16
    assert sorted(v["residual"] for v in preset.variants) == sorted(RESIDUALS)  # the main job: every built-in variant
    assert preset.run["train"]["warmup_steps"] == 60  # in the stable regime (docs/explanation/ablation.md)
    with pytest.raises(RunConfigError, match=r"unknown compare preset 'nope'; available: \[.*'smoke'"):
        load_preset("nope")
    with pytest.raises(ValueError, match=r"ModelConfig.residual_options.num_blocks.*allowed values"):
        load_preset("smoke", ["model.num_layers=3"])  # N=4 is not valid for 6 sub-layers


def test_presets_carry_cost_settings_and_set_overrides_them():
    assert load_preset("smoke").cost.repeats == 5 and load_preset("default").cost.repeats == 10
    preset = load_preset("smoke", ["cost.repeats=8", "cost.noise_threshold=0.5", "train.steps=3"])
    assert (preset.cost.repeats, preset.cost.warmup, preset.cost.noise_threshold) == (8, 1, 0.5)
    assert preset.run["train"]["steps"] == 3  # the other overrides still reach the run
    with pytest.raises(RunConfigError, match=r"cost.repeats must be an integer >= 5"):
        load_preset("smoke", ["cost.repeats=2"])
    with pytest.raises(RunConfigError, match=r"unknown key\(s\) \['rounds'\]; allowed: repeats, warmup"):
        load_preset("smoke", ["cost.rounds=2"])
