"""Every spelling that 0.2.0 replaced still works, with a DeprecationWarning (or a one-line note on the
command line) naming the new spelling, or fails in one line naming it (CHANGELOG.md, Deprecated and
Removed). None gives a bare TypeError or "unrecognized arguments"."""

import importlib

import pytest
import torch

from attnres import AttnResLM, ModelConfig, Variant, build_residual
from attnres.cli import main
from attnres.common.errors import InputError

SHAPE = dict(vocab_size=64, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)

# (residual, keywords of 0.1.0, the same model's residual_options today)
OLD_MODEL_KEYWORDS = [
    ("block_attnres", {"num_blocks": 4}, {"num_blocks": 4}),
    ("delta_block", {"num_blocks": 2, "exact_conversion": "gate"}, {"num_blocks": 2, "exact_conversion": "gate"}),
    ("full_attnres", {"router_query": "input_dependent"}, {"query": "input_dependent"}),
    ("full_attnres", {"router_weights": "sigmoid"}, {"weights": "sigmoid"}),
    ("block_attnres", {"num_blocks": 4, "router_key_norm": False}, {"num_blocks": 4, "key_norm": False}),
    ("denseformer", {"denseformer_dilation": 2, "denseformer_period": 2}, {"dilation": 2, "period": 2}),
    ("hyper_connections", {"hc_streams": 2, "hc_dynamic": False}, {"streams": 2, "dynamic": False}),
    ("mhc", {"hc_sinkhorn_iters": 5}, {"sinkhorn_iters": 5}),
]
IDS = [f"{residual}-{'-'.join(old)}" for residual, old, _ in OLD_MODEL_KEYWORDS]


@pytest.mark.parametrize("residual, old, new", OLD_MODEL_KEYWORDS, ids=IDS)
def test_model_config_old_option_keywords_warn_and_build_the_same_config(residual, old, new):
    with pytest.warns(DeprecationWarning, match=r"removed in 0\.3\.0; use ModelConfig\(\.\.\., residual_options=") as record:
        config = ModelConfig(**SHAPE, residual=residual, **old)
    message = str(record[0].message)
    assert all(f"{name}=" in message for name in old) and all(f"'{name}'" in message for name in new)
    assert config == ModelConfig(**SHAPE, residual=residual, residual_options=new)
    assert record[0].filename == __file__  # attributed to the caller's line, where Python shows it


def test_model_config_routing_keywords_warn_and_still_choose_the_routing():
    with pytest.warns(DeprecationWarning, match=r"set_routing"):
        config = ModelConfig(**SHAPE, residual="full_attnres", routing_impl="reference", routing_chunk_size=2)
    assert config == ModelConfig(**SHAPE, residual="full_attnres")  # not part of the model
    assert "routing_impl" not in config.to_dict()
    model = AttnResLM(config)
    assert model.residual.impl == "reference" and model.residual.chunk_size == 2


def test_model_config_unknown_keyword_is_still_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        ModelConfig(**SHAPE, bogus=1)


# (residual, build_residual keywords of 0.1.0, today's)
OLD_BUILD_KEYWORDS = [
    ("full_attnres", {"router_query": "input_dependent", "router_weights": "sigmoid", "router_key_norm": False},
     {"query": "input_dependent", "weights": "sigmoid", "key_norm": False}),
    ("denseformer", {"denseformer_dilation": 2, "denseformer_period": 2}, {"dilation": 2, "period": 2}),
    ("hyper_connections", {"hc_streams": 2, "hc_dynamic": False}, {"streams": 2, "dynamic": False}),
    ("mhc", {"hc_streams": 3, "hc_sinkhorn_iters": 4}, {"streams": 3, "sinkhorn_iters": 4}),
    ("standard", {"router_query": "static", "hc_streams": None}, {}),  # 0.1.0's defaults meant "not given"
]


@pytest.mark.parametrize("residual, old, new", OLD_BUILD_KEYWORDS, ids=[r for r, _, _ in OLD_BUILD_KEYWORDS])
def test_build_residual_old_keywords_warn_and_build_the_same_scheme(residual, old, new):
    with pytest.warns(DeprecationWarning, match=r"removed in 0\.3\.0; use build_residual\(\.\.\., ") as record:
        torch.manual_seed(0)
        scheme = build_residual(residual, num_layers=4, hidden_size=16, **old)
    assert all(f"{name}=" in str(record[0].message) for name in new)
    torch.manual_seed(0)
    expected = build_residual(residual, num_layers=4, hidden_size=16, **new)
    assert type(scheme) is type(expected)
    state, want = scheme.state_dict(), expected.state_dict()
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in state)


def test_variant_without_exact_conversions_warns():
    with pytest.warns(DeprecationWarning, match=r"Variant\(exact_conversions=\(\)\)"):
        variant = Variant(name="old_style", mode="none", exact_conversions=())
    assert variant == Variant(name="old_style", mode="none")


def test_variant_with_exact_conversions_fails_in_one_line_naming_options():
    with pytest.raises(InputError, match=r"exact_conversion field.*Variant\(options=\.\.\.\)") as error:
        Variant(name="old_gate", mode="add", sources="sublayers", exact_conversions=("gate",))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name, new", [("STREAM_OPTIONS", "options.names()"), ("block_variants", "variants_with_option"),
                                       ("check_residual", "resolve_options"), ("check_router_options", "resolve_options"),
                                       ("check_stream_options", "check_routing"), ("router_options", "mixer_options"),
                                       ("stream_options", "resolve_options")])
def test_removed_residual_names_fail_in_one_line_naming_the_replacement(name, new):
    module = importlib.import_module("attnres.residual")
    with pytest.raises(ImportError, match=rf"attnres\.residual\.{name} was removed in attnres 0\.2\.0; use .*{new}"):
        exec(f"from attnres.residual import {name}", {})
    with pytest.raises(ImportError, match="was removed"):
        getattr(module, name)
    with pytest.raises(AttributeError):  # any other missing name is the usual error
        getattr(module, "no_such_name")


@pytest.mark.parametrize("flags, option", [(["--num-blocks", "4"], "num_blocks=4"),
                                           (["--exact", "gate"], "exact_conversion=gate")])
def test_convert_old_flags_give_a_note_naming_option(flags, option, capsys, monkeypatch, tmp_path):
    """The flag is parsed (not "unrecognized arguments"), noted on stderr in one line, and passed on as
    the option; the conversion itself is not what is tested here."""
    seen = {}

    def fake_convert(source, out, residual, residual_options, dtype, max_seq_len):
        seen.update(residual_options)
        raise InputError("stop here")

    monkeypatch.setattr("attnres.hf.export.convert_to_hf", fake_convert)
    code = main(["convert", str(tmp_path), "--residual", "delta_block", *flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "stop here" in err
    note = next(line for line in err.splitlines() if "deprecated" in line)
    assert f"use --option {option}" in note and "removed in 0.3.0" in note
    name, value = option.split("=")
    assert str(seen[name]) == value


def test_convert_old_flag_contradicting_option_fails_in_one_line(capsys, tmp_path):
    code = main(["convert", str(tmp_path), "--residual", "block_attnres", "--num-blocks", "4", "--option",
                 "num_blocks=2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "contradicts --option num_blocks=2" in err


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         max_position_embeddings=32))
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("function", ["convert_checkpoint", "convert_to_hf", "model_config_from_hf"])
def test_conversion_keywords_of_0_1_0_warn_and_convert_the_same(function, qwen3_dir, tmp_path):
    from attnres.hf import convert, export

    old = {"num_blocks": 2, "exact_conversion": "gate"}
    call = {"convert_checkpoint": lambda **kw: convert.convert_checkpoint(qwen3_dir, "delta_block", **kw).config,
            "convert_to_hf": lambda **kw: export.convert_to_hf(qwen3_dir, tmp_path / str(len(kw)), "delta_block",
                                                               **kw)[1].config,
            "model_config_from_hf": lambda **kw: convert.model_config_from_hf(
                convert.read_source_config(qwen3_dir), "delta_block", **kw)}[function]
    with pytest.warns(DeprecationWarning, match=rf"{function}\(num_blocks=\.\.\., exact_conversion=\.\.\.\) is "
                                                rf"deprecated .*use {function}\(\.\.\., residual_options="):
        config = call(**old)
    assert config == call(residual_options=old)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        call(bogus=1)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match=r"num_blocks=2 contradicts"):
        call(num_blocks=2, residual_options={"num_blocks": 1})


def test_trainer_routers_is_the_expert_routers_under_a_deprecated_name():
    from attnres.train import Trainer

    trainer = object.__new__(Trainer)  # the attribute alone; a set-up needs data and a model
    trainer.expert_routers = ["gate of layer 1"]
    with pytest.warns(DeprecationWarning, match=r"Trainer\.routers is deprecated since attnres 0\.3\.0 and will "
                                                r"be removed in 0\.4\.0; use Trainer\.expert_routers"):
        assert trainer.routers is trainer.expert_routers


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
    ("attnres.routing.streams", "attnres.routing.stream_mixer", "StreamMixer"),
    ("attnres.hf.errors", "attnres.hf.conversion_error", "ConversionError"),
    ("attnres.report.analyze", "attnres.report.depth_analysis", "analyze"),
    ("attnres.report.analyze_plots", "attnres.report.depth_analysis_plots", "plot_cosine_matrices"),
    ("attnres.report.analyze_report", "attnres.report.depth_analysis_report", "cosine_routers"),
    ("attnres.model.generation", "attnres.generation.fast_generator", "FastGenerator"),
    ("attnres.model.compile_choice", "attnres.generation.compile_choice", "compile_pays"),
    ("attnres.model.memory_traffic", "attnres.generation.memory_traffic", "decode_bytes_per_step"),
    ("attnres.model.config", "attnres.model.model_config", "ModelConfig"),
    ("attnres.model.init", "attnres.model.init_weights", "init_module"),
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


@pytest.mark.parametrize("name", ["FastGenerator", "GenerationResult", "Sampling"])
def test_fast_generation_names_still_import_from_attnres_model_with_a_warning(name):
    import attnres.generation
    import attnres.model

    with pytest.warns(DeprecationWarning, match=rf"attnres\.model\.{name} is deprecated since attnres 0\.3\.0 .*; "
                                                rf"use attnres\.generation\.{name}$"):
        moved = getattr(attnres.model, name)
    assert moved is getattr(attnres.generation, name)
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        attnres.model.Nonexistent  # noqa: B018
