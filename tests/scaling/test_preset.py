"""Scaling presets: the rules give each size its shape and schedule; bad presets fail by name."""

import pytest
import yaml

from attnres.scaling.preset import (ScalingPresetError, SizeRules, available_presets, load_preset, size_name,
                                    size_run, size_seeds)

BASE = {
    "description": "two sizes",
    "variants": [{"residual": "standard"}, {"residual": "block_attnres", "num_blocks": 2}],
    "sizes": [{"hidden_size": 16, "num_layers": 2, "seeds": 2}, {"hidden_size": 32, "num_layers": 2}],
    "rules": {"head_dim": 8, "kv_groups": 2, "ffn_ratio": 2, "ffn_multiple": 8, "tokens_per_parameter": 1},
    "run": {"model": {"max_seq_len": 32}, "data": {"source": "demo", "vocab_size": 300},
            "train": {"batch_size": 2, "seq_len": 32, "lr": 1e-3}},
}


def write(tmp_path, values, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_bundled_presets_load():
    assert {"cpu", "paper", "tiny"} <= set(available_presets())
    for name in ("cpu", "paper", "tiny"):
        preset = load_preset(name)
        assert len(preset.sizes) >= 5, "a fit needs room: at least five sizes"
        assert any(v["residual"] == "standard" for v in preset.variants)


def test_cpu_preset_has_the_issue_variants_and_extra_seeds_at_small_sizes():
    preset = load_preset("cpu")
    residuals = {v["residual"] for v in preset.variants}
    assert {"standard", "block_attnres", "delta_block", "full_attnres"} <= residuals
    assert len(size_seeds(preset, preset.sizes[0])) >= 2
    assert len(size_seeds(preset, preset.sizes[-1])) == 1


def test_rules_derive_heads_kv_heads_and_ffn():
    shape = SizeRules(head_dim=16, kv_groups=2, ffn_ratio=3, ffn_multiple=64).shape({"hidden_size": 96, "num_layers": 8})
    assert shape == {"hidden_size": 96, "num_layers": 8, "num_heads": 6, "num_kv_heads": 3, "head_dim": 16,
                     "intermediate_size": 320}  # 3 x 96 = 288, rounded up to a multiple of 64


def test_explicit_size_fields_win_over_the_rules():
    shape = SizeRules(head_dim=128).shape({"hidden_size": 768, "num_layers": 12, "num_heads": 12, "head_dim": 64})
    assert (shape["num_heads"], shape["head_dim"]) == (12, 64)


def test_paper_preset_keeps_the_shapes_of_configs_paper():
    preset = load_preset("paper")
    shapes = {size_name(s): SizeRules.shape(preset.rules, s) for s in preset.sizes}
    assert shapes["d768-l12"]["num_heads"] == 12 and shapes["d768-l12"]["intermediate_size"] == 3072
    assert shapes["d1280-l36"]["intermediate_size"] == 4096
    assert shapes["d4096-l36"]["tie_embeddings"] is False


def test_schedule_scales_with_the_run_length(tmp_path):
    preset = load_preset(write(tmp_path, {**BASE, "rules": {**BASE["rules"], "warmup_fraction": 0.25,
                                                             "min_lr_ratio": 0.1, "evaluations": 4}}))
    run = size_run(preset, preset.sizes[0], tokens=64 * 100 + 1)  # 64 tokens per step: 101 steps
    train = run["train"]
    assert train["steps"] == 101
    assert train["warmup_steps"] == 25
    assert train["min_lr"] == pytest.approx(1e-4)
    assert train["eval_every"] == 26 and train["checkpoint_every"] == 51


def test_rules_override_and_run_override(tmp_path):
    preset = load_preset(write(tmp_path, BASE), ["rules.tokens_per_parameter=5", "train.lr=2e-3"])
    assert preset.rules.tokens_per_parameter == 5
    assert float(preset.run["train"]["lr"]) == 2e-3
    assert load_preset(write(tmp_path, BASE), ["rules.tokens_per_parameter=2e1"]).rules.tokens_per_parameter == 20


def test_variants_filter_keeps_standard(tmp_path):
    path = write(tmp_path, BASE)
    assert [v["residual"] for v in load_preset(path, variants=["standard"]).variants] == ["standard"]
    assert len(load_preset(path, variants=["standard", "block_attnres (N=2)"]).variants) == 2
    with pytest.raises(ScalingPresetError, match="must include standard"):
        load_preset(path, variants=["block_attnres"])
    with pytest.raises(ScalingPresetError, match="not in preset"):
        load_preset(path, variants=["standard", "mhc"])


def test_size_seeds_default_and_override(tmp_path):
    preset = load_preset(write(tmp_path, BASE))
    assert size_seeds(preset, preset.sizes[0]) == [0, 1]
    assert size_seeds(preset, preset.sizes[1]) == [0]
    assert size_seeds(preset, preset.sizes[1], seeds=3) == [0, 1, 2]


@pytest.mark.parametrize("change, message", [
    ({"sizes": [{"hidden_size": 16, "num_layers": 2}]}, "at least 2 sizes"),
    ({"sizes": [{"hidden_size": 16}, {"hidden_size": 32, "num_layers": 2}]}, r"sizes\[0\] needs num_layers"),
    ({"sizes": [{"hidden_size": 16, "num_layers": 2, "width": 3}, {"hidden_size": 32, "num_layers": 2}]},
     r"unknown key\(s\) \['width'\]"),
    ({"rules": {"warmup_fraction": 1.5}}, r"rules.warmup_fraction must be a number in \[0, 1\)"),
    ({"rules": {"tokens_per_parameter": 0}}, "rules.tokens_per_parameter must be a positive number"),
    ({"rules": {"ffn_mult": 3}}, r"unknown rules key\(s\) \['ffn_mult'\]"),
    ({"gpu": {"mfu": 2}}, r"gpu.mfu must be a number in \(0, 1\]"),
    ({"variants": [{"residual": "full_attnres"}]}, "include standard"),
    ({"budget": 3}, r"unknown key\(s\) \['budget'\]"),
])
def test_bad_presets_fail_naming_the_field(tmp_path, change, message):
    with pytest.raises(ScalingPresetError, match=message):
        load_preset(write(tmp_path, {**BASE, **change}))


def test_a_size_the_model_refuses_fails_at_load(tmp_path):
    # 2L = 4 sub-layers cannot hold N = 8 blocks: refused when the preset loads, not mid-sweep
    values = {**BASE, "variants": [{"residual": "standard"}, {"residual": "block_attnres", "num_blocks": 8}]}
    with pytest.raises(ValueError, match="num_blocks"):
        load_preset(write(tmp_path, values))


def test_unknown_preset_lists_the_bundled_ones():
    with pytest.raises(ScalingPresetError, match="available"):
        load_preset("nope")


def test_sizes_filter_keeps_the_named_sizes_with_their_settings(tmp_path):
    path = write(tmp_path, {**BASE, "sizes": BASE["sizes"] + [{"hidden_size": 48, "num_layers": 2}]})
    preset = load_preset(path, sizes=["d48-l2", "d16-l2"])
    assert [size_name(s) for s in preset.sizes] == ["d16-l2", "d48-l2"]  # the preset's order
    full = load_preset(path)
    assert size_run(preset, preset.sizes[1], 1000) == size_run(full, full.sizes[2], 1000)
    with pytest.raises(ScalingPresetError, match=r"--sizes: \['d8-l2'\] not in preset"):
        load_preset(path, sizes=["d8-l2", "d16-l2"])
    with pytest.raises(ScalingPresetError, match="at least 2 sizes"):
        load_preset(path, sizes=["d16-l2"])
