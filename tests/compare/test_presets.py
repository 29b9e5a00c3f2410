"""The bundled compare presets: every one loads and validates, and the ablation preset is the
Kimi paper's 16-layer ablation table (METHOD §6) with the contenders; rates taken from a study's
results.json are checked section by section."""

import json

import pytest

from attnres.compare.presets import available_presets, chosen_rates, load_preset
from attnres.report.variant_names import entry_options, variant_name
from attnres.train.run_config import RunConfigError


def test_every_bundled_preset_loads_and_validates_its_variants():
    names = available_presets()
    assert {"smoke", "default", "study", "ablation", "stability"} <= set(names)
    for name in names:
        assert load_preset(name).variants


def test_the_ablation_preset_is_the_kimi_table():
    preset = load_preset("ablation")
    assert preset.run["model"]["num_layers"] == 16 and preset.seeds >= 3
    assert [variant_name(v) for v in preset.variants] == [
        "standard", "denseformer", "mhc", "hyper_connections", "full_attnres", "full_attnres [input query]",
        "full_attnres [sigmoid]", "full_attnres [no key norm]", "block_attnres (N=8)", "delta_attnres",
        "delta_block (N=8)"]
    block = next(v for v in preset.variants if v["residual"] == "block_attnres")
    # Kimi's S = 4 sub-layers per block
    assert 2 * preset.run["model"]["num_layers"] // entry_options(block).num_blocks == 4


def test_the_smoke_preset_includes_a_contender():
    assert {"mhc"} & {v["residual"] for v in load_preset("smoke").variants}


@pytest.mark.parametrize("saved", [
    [1, 2],  # not an object
    {"variants": None},  # a section null
    {"variants": {"standard": 0.003}},  # of another type
    {"variants": [None]},
    {"variants": [{"name": "standard"}]},  # a variant without its rate
    {"variants": [{"name": "standard", "chosen_lr": "0.003"}]},
    {"variants": [{"name": "standard", "chosen_lr": True}]},
])
def test_rates_from_a_results_file_of_the_wrong_shape_is_refused_naming_the_section(saved, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(saved))
    with pytest.raises(RunConfigError, match=r"^preset p: rates_from .*results\.json is not a protocol study's "
                                             r"results: its 'variants' must be a list of objects, each with a 'name' "
                                             r"and a positive 'chosen_lr'; got "):
        chosen_rates(tmp_path, [{"residual": "standard"}], "preset p")


def test_rates_from_a_results_file_takes_each_variants_rate(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"variants": [{"name": "standard", "chosen_lr": 0.003}]}))
    assert chosen_rates(tmp_path, [{"residual": "standard"}], "preset p") == {"standard": 0.003}
