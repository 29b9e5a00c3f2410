"""Every spelling that 0.3.0 replaced still works, with a DeprecationWarning naming the new spelling, or
fails in one line naming it (CHANGELOG.md, Deprecated and Removed). The spellings deprecated in 0.2.0 are
gone: Python's or argparse's own error names them, and the files that spell them still load."""

import importlib

import pytest
import torch

from attnres import AttnResLM, ModelConfig, Variant, build_residual
from attnres.cli import main
from attnres.common.errors import InputError

SHAPE = dict(vocab_size=64, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)

# Spellings deprecated in 0.2.0 and removed in 0.3.0 (files that spell them keep loading: tests/fixtures/v0_2_0)
REMOVED_KEYWORDS = [
    ("ModelConfig", lambda: ModelConfig(**SHAPE, residual="block_attnres", num_blocks=4), "num_blocks"),
    ("ModelConfig", lambda: ModelConfig(**SHAPE, residual="full_attnres", routing_impl="reference"), "routing_impl"),
    ("Variant", lambda: Variant(name="old_style", mode="none", exact_conversions=()), "exact_conversions"),
]


@pytest.mark.parametrize("name, call, keyword", REMOVED_KEYWORDS, ids=[k for _, _, k in REMOVED_KEYWORDS])
def test_a_keyword_removed_in_0_3_0_is_a_type_error_naming_it(name, call, keyword):
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'"):
        call()


def test_build_residual_refuses_a_0_1_0_option_name():
    with pytest.raises(InputError, match=r"hc_streams"):
        build_residual("hyper_connections", num_layers=4, hidden_size=16, hc_streams=2)


def test_a_run_file_in_0_1_0_spelling_still_loads_as_todays_config():
    old = ModelConfig.from_dict({**SHAPE, "residual": "hyper_connections", "hc_streams": 2, "hc_dynamic": False})
    assert old == ModelConfig(**SHAPE, residual="hyper_connections", residual_options={"streams": 2, "dynamic": False})


def test_names_removed_in_0_2_0_are_plain_import_errors():
    with pytest.raises(ImportError, match="cannot import name 'STREAM_OPTIONS'"):
        exec("from attnres.residual import STREAM_OPTIONS", {})


def test_every_old_spelling_is_served_from_one_table_and_no_shim_file_is_left():
    from pathlib import Path

    from attnres import compat

    root = Path(compat.__file__).parent
    for old in compat.MOVED_MODULES:
        assert not (root.parent / (old.replace(".", "/") + ".py")).exists(), old
    assert {old for old, _, _ in MOVED_MODULES} == set(compat.MOVED_MODULES)
    warning = [path.relative_to(root) for path in root.rglob("*.py")
               if "warn_deprecated(" in path.read_text() and path.name != "compat.py"]
    assert warning == []


@pytest.mark.parametrize("flags", [["--num-blocks", "4"], ["--exact", "gate"]])
def test_convert_flags_removed_in_0_3_0_are_argument_errors(flags, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit:
        main(["convert", str(tmp_path), "--residual", "delta_block", *flags, "--out", str(tmp_path / "out")])
    assert exit.value.code == 2 and f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err


@pytest.mark.parametrize("module, function, arguments", [
    ("convert", "convert_checkpoint", ("unused", "delta_block")), ("export", "convert_to_hf", ("unused", "out")),
    ("convert", "model_config_from_hf", ({}, "delta_block"))])
def test_conversion_keywords_of_0_1_0_are_removed(module, function, arguments):
    call = getattr(importlib.import_module(f"attnres.hf.{module}"), function)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_blocks'"):
        call(*arguments, num_blocks=2)


def test_trainer_routers_are_the_expert_routers_of_its_model_with_a_warning():
    from attnres.model.moe_balance import expert_routers
    from attnres.train import Trainer
    from tests.model.test_kimi_decoder import config_for

    trainer = object.__new__(Trainer)  # the attribute alone; a set-up needs data and a model
    trainer.model = AttnResLM(config_for())
    with pytest.warns(DeprecationWarning, match=r"Trainer\.routers is deprecated since attnres 0\.3\.0 and will "
                                                r"be removed in 0\.4\.0; use attnres\.model\.moe_balance\.expert_routers"):
        routers = trainer.routers
    assert routers == expert_routers(trainer.model) and len(routers) == 3


def test_a_run_s_model_reads_as_the_dict_it_was_and_builds_its_config_with_a_warning():
    from attnres.train import RunConfig

    run = RunConfig.from_dict({"model": {**SHAPE, "residual": "block_attnres", "num_blocks": 2}})
    with pytest.warns(DeprecationWarning, match=r"RunConfig.model as a dict \(__getitem__\) is deprecated since "
                                                r"attnres 0\.3\.0 .*; use its fields as attributes"):
        assert run.model["residual"] == "block_attnres"
    with pytest.warns(DeprecationWarning, match=r"RunConfig.model as a dict \(get\)"):
        assert run.model.get("num_layers") == 4 and run.model.get("nothing", 7) == 7
    with pytest.warns(DeprecationWarning, match=r"RunConfig.model as a dict \((keys|__getitem__)\)"):
        assert dict(run.model) == run.model.to_dict()
    with pytest.warns(DeprecationWarning, match=r"RunConfig.build_model_config is deprecated since attnres 0\.3\.0 "
                                                r".*; use run.model.with_vocab_size\(vocab_size\)"):
        assert run.build_model_config(100) == run.model.with_vocab_size(100)


@pytest.mark.parametrize("old_call", ["positional", "keywords", "padding_mask only"])
def test_kimi_delta_attention_call_of_0_2_0_warns_and_gives_the_token_mixer_call(old_call):
    from attnres.model import KDAConfig, KVCache
    from attnres.model.kda import KimiDeltaAttention

    torch.manual_seed(0)
    layer = KimiDeltaAttention(16, KDAConfig(num_heads=2, head_dim=8, short_conv_kernel_size=4))
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[False, True, True, True, True], [True] * 5])
    expected_cache = KVCache()
    expected = layer(x, None, expected_cache, 3, None, mask)
    cache = KVCache()
    with pytest.warns(DeprecationWarning, match=r"KimiDeltaAttention\.forward\(x, cache, layer_idx, padding_mask\) is "
                                                r"deprecated since attnres 0\.3\.0 .*; use forward\(x, rope, cache"):
        if old_call == "positional":
            out = layer(x, cache, 3, mask)
        elif old_call == "keywords":
            out = layer(x, cache=cache, layer_idx=3, padding_mask=mask)
        else:
            out = layer(x, None, cache, 3, padding_mask=mask)
    assert torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(cache.linear_state(3), expected_cache.linear_state(3)))


# (module of 0.2.0, its name today, a name it exports): modules renamed so that no two files the
# reader opens share a name (issue 41)
MOVED_MODULES = [
    ("attnres.bench.config", "attnres.bench.bench_config", "BenchConfig"),
    ("attnres.bench.run", "attnres.bench.run_bench", "run_bench"),
    ("attnres.compare.run", "attnres.compare.run_comparison", "run_compare"),
    ("attnres.compare.cost", "attnres.compare.cost_measurement", "measure_costs"),
    ("attnres.train.cost", "attnres.train.step_cost", "VariantRunner"),
    ("attnres.train.init", "attnres.train.starting_model", "build_model"),
    ("attnres.data.errors", "attnres.data.data_error", "DataError"),
    ("attnres.data.config", "attnres.data.data_config", "DataConfig"),
    ("attnres.train.config", "attnres.train.train_config", "TrainConfig"),
    ("attnres.residual.streams", "attnres.residual.stream_scheme", "StreamScheme"),
    ("attnres.routing.streams", "attnres.methods.stream_mixer", "StreamMixer"),
    ("attnres.hf.errors", "attnres.hf.conversion_error", "ConversionError"),
    ("attnres.report.analyze", "attnres.analyze.run_analysis", "analyze"),
    ("attnres.report.analyze_plots", "attnres.report.depth_analysis_plots", "plot_cosine_matrices"),
    ("attnres.report.analyze_report", "attnres.report.depth_analysis_report", "cosine_routers"),
    ("attnres.model.generation", "attnres.generation.fast_generator", "FastGenerator"),
    ("attnres.model.compile_choice", "attnres.generation.compile_choice", "compile_pays"),
    ("attnres.model.memory_traffic", "attnres.generation.memory_traffic", "decode_bytes_per_step"),
    ("attnres.model.config", "attnres.model.model_config", "ModelConfig"),
    ("attnres.model.init", "attnres.model.init_weights", "init_module"),
    ("attnres.routing.depth_average", "attnres.methods.denseformer", "DenseFormerOptions"),
    ("attnres.routing.hyper_connections", "attnres.methods.hyper_connections", "HyperConnection"),
    ("attnres.routing.mhc", "attnres.methods.mhc", "sinkhorn"),
    ("attnres.routing.mixer", "attnres.methods.depth_mixer", "DepthMixer"),
    ("attnres.routing.options", "attnres.methods.options", "VariantOptions"),
    ("attnres.routing.router", "attnres.methods.router", "Router"),
]


@pytest.mark.parametrize("old, new, name", MOVED_MODULES, ids=[old for old, _, _ in MOVED_MODULES])
def test_a_moved_module_still_imports_with_a_warning_naming_its_new_name(old, new, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"the module {old} is deprecated since attnres 0\.3\.0 .*; "
                                                rf"use {new}$"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        module.__wrapped_by_nothing__  # noqa: B018  (dunders: no warning, no import)


@pytest.mark.parametrize("name, expected", [("test", "pytest"), ("compare", "usage: attnres compare")])
def test_the_readme_commands_of_0_2_0_still_run_with_a_note_naming_tools(name, expected):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    argument = "--version" if name == "test" else "--help"  # cheap: pytest's version, the command's help
    result = subprocess.run(["bash", str(root / "scripts" / f"{name}.sh"), argument], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert (f"scripts/{name}.sh is deprecated since attnres 0.3.0 and will be removed in 0.4.0; use tools/{name}.sh"
            in result.stderr)
    assert expected in result.stdout + result.stderr


# (module of 0.2.0, a name that moved out of it, the module that holds it now)
MOVED_NAMES = [
    *[("attnres.model", name, "attnres.generation") for name in ("FastGenerator", "GenerationResult", "Sampling")],
    *[("attnres.model.model_config", name, "attnres.report.variant_names") for name in ("variant_name", "entry_options")],
    ("attnres.model.layers", "Attention", "attnres.model.attention"),
    ("attnres.model.layers", "apply_rotary", "attnres.model.attention"),
    ("attnres.model.layers", "MLP", "attnres.model.mlp"),
    ("attnres.model.layers", "MixtureOfExperts", "attnres.model.moe"),
    ("attnres.model.layers", "KimiDeltaAttention", "attnres.model.kda"),
    ("attnres.model.layers", "LatentAttention", "attnres.model.mla"),
    *[("attnres.routing", name, "attnres.methods") for name in (
        "DepthMixer", "DepthWeightedAverage", "HyperConnection", "ManifoldHyperConnection", "MixerFlops", "QUERY_KINDS",
        "Router", "StreamMixer", "WEIGHT_KINDS")],
    *[("attnres.residual.variants", name, "attnres.methods") for name in (
        "EXACT_CONVERSIONS", "SOURCE_KINDS", "STREAM_IMPLS", "BlockCount", "BlockOptions",
        "DeltaBlockOptions", "Variant", "register_variant", "unregister_variant")],
]


@pytest.mark.parametrize("old, name, new", MOVED_NAMES, ids=[f"{old}.{name}" for old, name, _ in MOVED_NAMES])
def test_a_name_that_moved_out_of_a_module_still_imports_from_it_with_a_warning(old, name, new):
    from attnres import compat

    assert compat.MOVED_NAMES[old][name] == new
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} is deprecated since attnres 0\.3\.0 .*; "
                                                rf"use {new}\.{name}$"):
        moved = getattr(importlib.import_module(old), name)
    assert moved is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        importlib.import_module(old).Nonexistent  # noqa: B018


def test_the_moved_names_are_all_tested():
    from attnres import compat

    assert {(old, name) for old, names in compat.MOVED_NAMES.items() for name in names} == {
        (old, name) for old, name, _ in MOVED_NAMES}
