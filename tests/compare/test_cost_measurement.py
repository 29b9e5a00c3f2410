"""The cost measurement after training: every variant's training step interleaved in one process,
fresh models of the runs' configurations, memory; settings validated."""

import pytest

import attnres.compare.cost_measurement as cost_module
from attnres.compare.cost_measurement import CostSettings, measure_costs
from attnres.train import RunConfig, RunConfigError


def tiny_run(residual, **model):
    return RunConfig.from_dict({
        "out_dir": "unused",
        "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32,
                  "max_seq_len": 16, "residual": residual, **model},
        "data": {"source": "demo"},
        "train": {"batch_size": 2, "seq_len": 16, "precision": "fp32"}})


def test_every_variant_is_timed_in_every_round_standard_first(monkeypatch):
    calls = []
    real_step = cost_module.VariantRunner.train_step

    def recording_step(runner):
        calls.append(runner.config.residual)
        return real_step(runner)

    monkeypatch.setattr(cost_module.VariantRunner, "train_step", recording_step)
    runs = {"block_attnres (N=2)": tiny_run("block_attnres", residual_options={"num_blocks": 2}),
            "standard": tiny_run("standard")}
    lines = []
    result = measure_costs(runs, vocab_size=40, settings=CostSettings(repeats=5, warmup=1), log=lines.append)
    # interleaved: each round runs standard, then the variant; one warm-up round is dropped
    assert calls[:12] == ["standard", "block_attnres"] * 6
    assert list(result["variants"]) == ["standard", "block_attnres (N=2)"]
    assert lines[0] == "cost: round 1/6 (warm-up)" and len(lines) == 6
    for name, measured in result["variants"].items():
        assert len(measured["train_step_s"]["samples_s"]) == 5, name
        assert measured["memory"]["peak_bytes"] > measured["memory"]["activation_bytes"] > 0
    block = result["variants"]["block_attnres (N=2)"]
    assert block["model"]["vocab_size"] == 40 and block["model"]["residual_options"]["num_blocks"] == 2
    assert block["parameters"] > result["variants"]["standard"]["parameters"]  # its routers
    settings = result["settings"]
    assert (settings["batch_size"], settings["seq_len"], settings["precision"]) == (2, 16, "fp32")
    assert settings["repeats"] == 5 and settings["routing"] in ("lean", "triton", "fused", "reference")
    assert result["machine"]["device"] == "cpu" and "threads" in result["machine"]


def test_the_baseline_is_required():
    with pytest.raises(ValueError, match="exactly one 'standard' run"):
        measure_costs({"full_attnres": tiny_run("full_attnres")}, vocab_size=40, settings=CostSettings())


def test_settings_are_validated():
    assert CostSettings.from_dict(None) == CostSettings()
    assert CostSettings.from_dict({"repeats": 9}).repeats == 9
    with pytest.raises(RunConfigError, match="cost.repeats must be an integer >= 5"):
        CostSettings(repeats=4)
    with pytest.raises(RunConfigError, match="cost.noise_threshold must be a positive number"):
        CostSettings(noise_threshold=0)
    with pytest.raises(RunConfigError, match=r"unknown key\(s\) \['rounds'\]"):
        CostSettings.from_dict({"rounds": 5})
    with pytest.raises(RunConfigError, match="must be a mapping"):
        CostSettings.from_dict([5])
