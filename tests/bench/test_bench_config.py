"""BenchConfig: YAML presets, --quick, --set, explicit options, generated flags, and errors that name the option."""

import argparse
from dataclasses import fields

import pytest

import attnres.bench
from attnres.bench.bench_config import (MIN_REPEATS, OPTION_NAMES, QUICK_VALUES, SETTING_NAMES, BenchConfig,
                                  available_presets, compared_variants, resolve_config)
from attnres.bench.model_bench import model_shape
from attnres.cli import build_parser, main
from attnres.common.errors import InputError
from attnres.residual import VARIANTS, Variant, nearest_num_blocks, register_variant, unregister_variant


def test_cpu_preset_is_the_targets_shape():
    config = resolve_config()
    assert (config.hidden_size, config.num_layers, config.seq_len) == (256, 24, 256)
    assert config.precision == "bf16" and config.device == "cpu" and config.routing_impl == "auto"
    assert config.variants == tuple(name for name in VARIANTS if name != "standard") == compared_variants()
    assert config.depths == (12, 24, 48)
    assert config.repeats >= MIN_REPEATS


def test_quick_then_explicit_options_win():
    config = resolve_config("cpu", quick=True, hidden_size=32, variants="block_attnres, delta_block",
                            depths="3,6", precision=None)
    assert config.hidden_size == 32 and config.num_layers == QUICK_VALUES["num_layers"]
    assert config.variants == ("block_attnres", "delta_block") and config.depths == (3, 6)
    assert config.precision == "bf16" and config.quick
    assert resolve_config(depths="none").depths == ()
    assert resolve_config(variants=["full_attnres", "delta_block,block_attnres"]).variants == \
        ("full_attnres", "delta_block", "block_attnres")


def test_paper_gpu_preset_runs_on_cuda():
    config = resolve_config("paper-gpu", device=None)
    assert config.device == "cuda" and config.hidden_size == 2048 and config.num_layers == 32 and config.seq_len == 4096


@pytest.mark.parametrize("overrides, message", [
    ({"repeats": 3}, "--repeats must be an integer >= 5"),
    ({"warmup": -1}, "--warmup must be an integer >= 0"),
    ({"hidden_size": 0}, "--hidden must be a positive integer"),
    ({"hidden_size": 33}, "--hidden must be even"),
    ({"precision": "fp16"}, "--precision must be one of ['bf16', 'fp32'], got 'fp16'"),
    ({"routing_impl": "fast"}, "--routing-impl must be one of ['auto', 'reference', 'lean', 'triton', 'fused']"),
    ({"variants": "block_attnres,foo"}, "--variants: unknown variant 'foo'; allowed: "),
    ({"variants": "standard"}, "'standard' is always run as the baseline"),
    ({"variants": "delta_block,delta_block"}, "--variants lists a variant twice"),
    ({"depths": "12,x"}, "--depths must be comma-separated positive integers"),
    ({"depths": "12,0"}, "--depths: every depth must be a positive integer, got 0"),
    ({"device": "tpu"}, "--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ({"threads": 0}, "--threads must be a positive integer"),
    ({"compiled_decode": "yes"}, "--compiled-decode must be true or false, got 'yes'"),
])
def test_invalid_settings_name_the_option(overrides, message):
    with pytest.raises(InputError) as error:
        resolve_config(**overrides)
    assert message in str(error.value)


def test_unknown_preset_and_setting():
    with pytest.raises(InputError, match=r"--preset must be one of \['cpu', 'kimi-linear', 'paper-gpu'\], got 'big'"):
        resolve_config("big")
    with pytest.raises(InputError, match="unknown bench settings"):
        resolve_config(width=3)
    with pytest.raises(InputError, match="--preset"):
        BenchConfig(preset="gpu")


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "2"], "--repeats must be an integer >= 5"),
    (["--precision", "fp16"], "--precision must be one of ['bf16', 'fp32']"),
    (["--variants", "mhc2"], "--variants: unknown variant 'mhc2'"),
    (["--preset", "tiny"], "--preset must be one of ['cpu', 'kimi-linear', 'paper-gpu']"),
])
def test_cli_exits_2_with_the_message(argv, message, capsys, tmp_path):
    assert main(["bench", "--quick", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_cli_refuses_cuda_when_absent(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    assert main(["bench", "--quick", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err


def test_block_count_and_heads():
    assert nearest_num_blocks(2 * 24, 8) == 8
    assert nearest_num_blocks(2 * 2, 8) == 4  # 4 sub-layers: 1, 2 or 4 blocks
    assert nearest_num_blocks(2 * 6, 5) == 4  # 12 sub-layers: 5 is invalid; 4 and 6 tie, the smaller wins
    assert model_shape(256) == {"num_heads": 4, "num_kv_heads": 2, "intermediate_size": 768}
    assert model_shape(32) == {"num_heads": 1, "num_kv_heads": 1, "intermediate_size": 96}


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_cpu_preset_matches_the_defaults_and_quick_is_no_preset():
    # --help shows BenchConfig's defaults as those of the default preset: the two must not drift apart.
    assert resolve_config("cpu") == BenchConfig()
    assert available_presets() == ["cpu", "kimi-linear", "paper-gpu"]
    assert QUICK_VALUES["num_layers"] == 4 and QUICK_VALUES["threads"] == 1


def test_preset_yaml_file(tmp_path):
    path = _write(tmp_path / "small.yaml", "hidden_size: 32\nnum_layers: 3\nvariants: [delta_block]\n"
                                           "depths: [3, 6]\nprecision: fp32\n")
    config = resolve_config(path)
    assert (config.hidden_size, config.num_layers, config.precision) == (32, 3, "fp32")
    assert config.variants == ("delta_block",) and config.depths == (3, 6)
    assert config.preset == path and config.seq_len == BenchConfig().seq_len  # unset fields keep the defaults


@pytest.mark.parametrize("text, message", [
    ("width: 3\n", "unknown bench settings ['width']; allowed: "),
    ("quick: true\n", "unknown bench settings ['quick']"),
    ("- 3\n", "must hold a mapping of settings"),
    ("hidden_size: [\n", "is not valid YAML"),
    ("hidden_size: 0\n", "--hidden must be a positive integer"),
])
def test_preset_yaml_errors(tmp_path, text, message):
    path = _write(tmp_path / "bad.yaml", text)
    with pytest.raises(InputError) as error:
        resolve_config(path)
    assert message in str(error.value)


def test_missing_preset_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        resolve_config(str(tmp_path / "absent.yaml"))


def test_set_values_are_yaml():
    config = resolve_config(quick=True, set_args=["depths=[3, 6]", "precision=fp32", "threads=null",
                                                  "variants=block_attnres,delta_block", "repeats=7"])
    assert config.depths == (3, 6) and config.precision == "fp32" and config.repeats == 7
    assert config.threads is None  # null overrides --quick's single thread
    assert config.variants == ("block_attnres", "delta_block")
    assert resolve_config(set_args=["depths=none"]).depths == ()


@pytest.mark.parametrize("items, message", [
    (["width=3"], "--set: unknown bench settings ['width']; allowed: ["),
    (["preset=paper-gpu"], "--set: unknown bench settings ['preset']"),
    (["repeats"], "must look like key=value"),
    (["repeats=[5"], "not valid YAML"),
    (["repeats=five"], "--repeats must be an integer >= 5"),
])
def test_set_errors(items, message):
    with pytest.raises(InputError) as error:
        resolve_config(set_args=items)
    assert message in str(error.value)
    if "unknown" in message:
        assert "hidden_size" in str(error.value)  # the allowed keys are named


def _bench_parser() -> argparse.ArgumentParser:
    root = build_parser()
    subparsers = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["bench"]


def test_every_setting_has_a_generated_flag(capsys):
    actions = {a.dest: a for a in _bench_parser()._actions}
    settings = [f for f in fields(BenchConfig) if f.name not in ("preset", "quick")]
    assert [f.name for f in settings] == list(SETTING_NAMES)
    for spec in settings:
        action = actions[spec.name]
        flag = OPTION_NAMES[spec.name]
        assert action.option_strings == ([flag, "--no-" + flag[2:]] if spec.type in (bool, "bool") else [flag])
        assert spec.metadata["help"] in action.help and action.default is None
    assert {OPTION_NAMES[n] for n in ("hidden_size", "num_layers", "seq_len", "routing_impl")} == \
        {"--hidden", "--layers", "--seq-len", "--routing-impl"}
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = capsys.readouterr().out
    assert all(OPTION_NAMES[name] in help_text for name in SETTING_NAMES)


def test_flags_parse_to_field_types():
    args = build_parser().parse_args(["bench", "--hidden", "32", "--threads", "2", "--precision", "fp32",
                                      "--variants", "delta_block", "block_attnres", "--depths", "3,6",
                                      "--no-compiled-decode"])
    assert args.hidden_size == 32 and args.threads == 2 and args.precision == "fp32"
    assert args.compiled_decode is False and build_parser().parse_args(["bench"]).compiled_decode is None
    assert args.variants == ["delta_block", "block_attnres"] and args.depths == ["3,6"]
    assert args.num_layers is None  # not given: the preset's value stays
    config = resolve_config(**{name: getattr(args, name) for name in SETTING_NAMES})
    assert config.depths == (3, 6) and config.variants == ("delta_block", "block_attnres")


@pytest.fixture
def resolved(monkeypatch):
    """Run `attnres bench` without benchmarking: the BenchConfig it would run is captured instead."""
    captured = {}

    def fake_run_bench(config, out, command=""):
        captured["config"] = config
        return {}

    monkeypatch.setattr(attnres.bench, "run_bench", fake_run_bench)
    monkeypatch.setattr(attnres.bench, "format_markdown", lambda results: "")
    return captured


def test_precedence_preset_quick_set_flag(tmp_path, resolved):
    preset = _write(tmp_path / "mine.yaml", "hidden_size: 128\nnum_layers: 6\nseq_len: 64\nseed: 7\n")
    argv = ["bench", "--preset", preset, "--quick", "--set", "hidden_size=48", "--set", "num_layers=3",
            "--hidden", "32", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    config = resolved["config"]
    assert config.seed == 7  # the preset's, which --quick leaves alone
    assert config.seq_len == QUICK_VALUES["seq_len"]  # --quick over the preset
    assert config.num_layers == 3  # --set over --quick
    assert config.hidden_size == 32  # the flag over --set
    assert config.preset == preset and config.quick


def test_cli_preset_file_and_set_errors(tmp_path, resolved, capsys):
    preset = _write(tmp_path / "typo.yaml", "hiden_size: 64\n")
    assert main(["bench", "--preset", preset, "--out", str(tmp_path)]) == 2
    assert "unknown bench settings ['hiden_size']" in capsys.readouterr().err
    assert main(["bench", "--set", "width=3", "--out", str(tmp_path)]) == 2
    assert "--set: unknown bench settings ['width']" in capsys.readouterr().err
    assert "config" not in resolved


class _EqualWeights(attnres.DepthMixer):
    """A toy mixer for the variant table: the plain mean of the sources."""

    def __init__(self, hidden_size, eps, gated=False):
        super().__init__()

    def forward(self, sources, need_weights=True):
        return sum(sources) / len(sources), None


@pytest.fixture
def equal_weights_variant():
    variant = register_variant(Variant("bench_equal_weights", "replace", "sublayers", "d", mixer=_EqualWeights))
    yield variant
    unregister_variant(variant.name)


def test_a_registered_variant_is_benchmarked_by_default(equal_weights_variant, resolved, tmp_path, capsys):
    # The default is read from the variant table when the config is made, not when the module was imported.
    assert BenchConfig().variants[-1] == "bench_equal_weights"
    assert resolve_config(quick=True).variants == compared_variants() and "bench_equal_weights" in compared_variants()
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    assert "bench_equal_weights" in resolved["config"].variants
    with pytest.raises(SystemExit):  # --help states the default, the registered variant included
        main(["bench", "--help"])
    assert "delta_block,denseformer,hyper_connections,mhc,bench_equal_weights)" in capsys.readouterr().out.replace(
        "\n", "").replace(" ", "")


def test_residual_options_go_to_the_variants_that_have_them_at_each_depth():
    config = resolve_config(quick=True, set_args=["options=[num_blocks=8, query=input_dependent]"])
    assert config.option_values() == {"num_blocks": 8, "query": "input_dependent"}
    assert config.variant_options("block_attnres", 24) == {"num_blocks": 8, "query": "input_dependent"}
    assert config.variant_options("block_attnres", 2) == {"num_blocks": 4, "query": "input_dependent"}  # nearest valid
    assert config.variant_options("mhc", 24) == {}
    assert resolve_config(quick=True, options=["num_blocks=2"]).option_values() == {"num_blocks": 2}
    with pytest.raises(InputError, match=r"--option: \['blocks'\] is no option of any variant; the variants' "
                                         r"options: \[.*'num_blocks'"):
        resolve_config(quick=True, options=["blocks=2"])
    with pytest.raises(InputError, match=r"--option: block_attnres needs num_blocks; give it as --option "
                                         r"num_blocks=VALUE"):
        resolve_config(quick=True, set_args=["options=[]"], variants="block_attnres")


def test_kimi_linear_preset_benchmarks_kimi_linear_at_the_dense_active_width():
    from attnres import ModelConfig
    from attnres.model.flops import parameter_count

    config = resolve_config("kimi-linear")
    assert config.architecture == "kimi_linear" and config.precision == "fp32" and not config.compiled_decode
    dense, kimi = model_shape(256), model_shape(256, "kimi_linear")
    assert kimi["moe"]["experts_per_token"] * kimi["moe"]["expert_size"] + kimi["moe"]["expert_size"] \
        == dense["intermediate_size"]  # 2 routed + 1 shared expert: the dense SwiGLU's width, active
    model = ModelConfig(vocab_size=256, hidden_size=256, num_layers=8, **kimi)
    assert model.layer_types.count("latent_attention") == 2 and model.moe.dense_layers == 1
    assert parameter_count(model).total > parameter_count(ModelConfig(vocab_size=256, hidden_size=256,
                                                                       num_layers=8, **dense)).total
    with pytest.raises(InputError, match=r"--architecture must be one of \['dense', 'kimi_linear'\]"):
        resolve_config(architecture="moe")
