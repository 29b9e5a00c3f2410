"""BenchConfig: presets, --quick, explicit options, and errors that name the option."""

import pytest

from attnres.bench.config import MIN_REPEATS, QUICK_VALUES, VARIANTS, BenchConfig, resolve_config
from attnres.bench.model_bench import model_shape, nearest_num_blocks
from attnres.cli import main


def test_cpu_preset_is_the_targets_shape():
    config = resolve_config()
    assert (config.hidden_size, config.num_layers, config.seq_len) == (256, 24, 256)
    assert config.precision == "bf16" and config.device == "cpu" and config.routing_impl == "auto"
    assert config.variants == VARIANTS and config.depths == (12, 24, 48)
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
    ({"routing_impl": "fast"}, "--routing-impl must be one of ['auto', 'reference', 'lean', 'triton']"),
    ({"variants": "block_attnres,foo"}, "--variants: unknown variant 'foo'; allowed: "),
    ({"variants": "standard"}, "'standard' is always run as the baseline"),
    ({"variants": "delta_block,delta_block"}, "--variants lists a variant twice"),
    ({"depths": "12,x"}, "--depths must be comma-separated positive integers"),
    ({"depths": "12,0"}, "--depths: every depth must be a positive integer, got 0"),
    ({"device": "tpu"}, "--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ({"threads": 0}, "--threads must be a positive integer"),
])
def test_invalid_settings_name_the_option(overrides, message):
    with pytest.raises(ValueError) as error:
        resolve_config(**overrides)
    assert message in str(error.value)


def test_unknown_preset_and_setting():
    with pytest.raises(ValueError, match=r"--preset must be one of \['cpu', 'paper-gpu'\], got 'big'"):
        resolve_config("big")
    with pytest.raises(ValueError, match="unknown bench settings"):
        resolve_config(width=3)
    with pytest.raises(ValueError, match="--preset"):
        BenchConfig(preset="gpu")


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "2"], "--repeats must be an integer >= 5"),
    (["--precision", "fp16"], "--precision must be one of ['bf16', 'fp32']"),
    (["--variants", "mhc"], "--variants: unknown variant 'mhc'"),
    (["--preset", "tiny"], "--preset must be one of ['cpu', 'paper-gpu']"),
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
    assert nearest_num_blocks(24, 8) == 8
    assert nearest_num_blocks(2, 8) == 4  # 4 sub-layers: 1, 2 or 4 blocks
    assert nearest_num_blocks(6, 5) == 4  # 12 sub-layers: 5 is invalid; 4 and 6 tie, the smaller wins
    assert model_shape(256) == {"num_heads": 4, "num_kv_heads": 2, "intermediate_size": 768}
    assert model_shape(32) == {"num_heads": 1, "num_kv_heads": 1, "intermediate_size": 96}
