"""The equal-time arms follow the protocol: an arm only for a primary variant that meets the rule's first
condition, standard trained c times as long, c from the main study's own one-thread, 11-round measurement."""

import json
import shutil

import pytest

from attnres.compare.presets import load_preset
from tools.studies import equal_time

SEEDS = range(1000, 1016)
NOISE = [0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0] * 2
NAMES = {"standard": "standard", "block_attnres": "block_attnres (N=8)", "hyper_connections": "hyper_connections",
         "delta_block": "delta_block (N=8)"}


def main_results(gains: dict[str, float], step_s: dict[str, float], repeats=11, threads=1) -> dict:
    variants = []
    for residual, name in NAMES.items():
        gain = gains.get(residual, 0.0)
        runs = [{"seed": s, "final_test_loss": 4.6 + gain + (n if gain else 0.0)} for s, n in zip(SEEDS, NOISE)]
        variants.append({"name": name, "residual": residual, "chosen_lr": 0.004, "runs": runs})
    cost = {"settings": {"repeats": repeats, "warmup": 2, "noise_threshold": 0.25},
            "machine": {"threads": threads},
            "variants": {NAMES[r]: {"train_step_s": {"median_s": s, "samples_s": [s * (1 + 0.001 * i) for i in
                                                                                 range(repeats)]}}
                         for r, s in step_s.items()}}
    return {"protocol": {"failure_threshold": 7.6}, "variants": variants, "cost": cost}


STEPS = {"standard": 0.100, "block_attnres": 0.108, "hyper_connections": 0.144, "delta_block": 0.107}


def test_an_arm_only_for_a_contrast_that_survives_holm_with_a_negative_mean():
    # Block AttnRes better, hyper-connections clearly worse (survives, but the rule's first condition fails)
    found = equal_time.arms(main_results({"block_attnres": -0.1, "hyper_connections": 0.2, "delta_block": 0.001},
                                         STEPS))
    assert list(found) == ["block_attnres"] and found["block_attnres"] == pytest.approx(1.08)


@pytest.mark.parametrize("repeats, threads", [(5, 1), (11, 2)])
def test_a_cost_measurement_other_than_the_protocols_is_refused_naming_the_command(repeats, threads):
    results = main_results({"block_attnres": -0.1}, STEPS, repeats=repeats, threads=threads)
    with pytest.raises(ValueError, match="OMP_NUM_THREADS=1 attnres compare --preset protocol_dense .*cost.repeats=11"):
        equal_time.arms(results)


def test_the_arm_is_a_preset_of_standard_alone_c_times_as_long_on_the_final_seeds(tmp_path, monkeypatch, capsys):
    presets = tmp_path / "presets"
    presets.mkdir()
    shutil.copy(equal_time.PRESETS / "protocol_dense.yaml", presets)
    monkeypatch.setattr(equal_time, "PRESETS", presets)
    study = tmp_path / "protocol-dense"
    study.mkdir()
    (study / "results.json").write_text(json.dumps(main_results({"block_attnres": -0.1}, STEPS)))
    assert equal_time.main(["--results", str(study)]) == 0
    assert "block_attnres: c = 1.0800, standard trains 1987 steps" in capsys.readouterr().out
    preset = load_preset(str(presets / "protocol_equal_time_block_attnres.yaml"))
    assert [v["residual"] for v in preset.variants] == ["standard"] and preset.protocol is None
    assert preset.run["train"]["steps"] == 1987 and preset.run["train"]["warmup_steps"] == 180
    assert preset.seed_start == 1000 and preset.seeds == 16 and preset.rates == {"standard": 0.004}
    with pytest.raises(SystemExit, match="exists; pass --force"):
        equal_time.main(["--results", str(study)])
    assert equal_time.main(["--results", str(study), "--force"]) == 0
