"""The bundled compare presets: every one loads and validates, and the ablation preset is the
Kimi paper's 16-layer ablation table (METHOD §6) with the contenders."""

from attnres.compare.presets import available_presets, load_preset
from attnres.model.model_config import entry_options, variant_name


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
