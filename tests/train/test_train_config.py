"""TrainConfig and RunConfig: YAML, overrides and clear errors."""

import pytest

from attnres.train import RunConfig, RunConfigError, TrainConfig, TrainConfigError, load_run_config

MODEL = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.mark.parametrize("overrides, pattern", [
    (dict(steps=0), r"TrainConfig.steps must be a positive integer, got 0"),
    (dict(schedule="linear"), r"TrainConfig.schedule must be one of \['cosine', 'wsd', 'constant'\]"),
    (dict(precision="fp16"), r"TrainConfig.precision must be one of \['bf16', 'fp32'\]"),
    (dict(min_lr=1.0, lr=0.1), r"TrainConfig.min_lr must be a number in \[0, lr=0.1\]"),
    (dict(beta2=1.0), r"TrainConfig.beta2 must be a number in \[0, 1\)"),
    (dict(grad_clip=0), r"TrainConfig.grad_clip must be a positive number"),
    (dict(warmup_steps=-1), r"TrainConfig.warmup_steps must be an integer >= 0"),
    (dict(compile="yes"), r"TrainConfig.compile must be true or false"),
    (dict(query_init="xavier"), r"TrainConfig.query_init must be one of \['zero', 'normal'\]"),
])
def test_train_config_errors(overrides, pattern):
    with pytest.raises(TrainConfigError, match=pattern):
        TrainConfig(**overrides)


def test_yaml_with_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("out_dir: runs/x\nmodel:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 2\n"
                    "  num_kv_heads: 1\n  intermediate_size: 64\ntrain:\n  steps: 5\n")
    run = load_run_config(path, ["train.lr=1e-3", "model.residual=block_attnres", "model.num_blocks=2",
                                 "data.source=/tmp/x", "train.grad_clip=null", "out_dir=elsewhere"])
    assert run.train.lr == 1e-3 and run.train.steps == 5 and run.train.grad_clip is None
    assert run.model.residual == "block_attnres" and run.data.source == "/tmp/x"
    assert run.out_dir == "elsewhere"
    assert run.model.vocab_size == "auto" and run.model.with_vocab_size(123).vocab_size == 123  # not yet known
    assert RunConfig.from_dict(run.to_dict()) == run


@pytest.mark.parametrize("overrides, pattern", [
    (["train.stepz=3"], r"unknown train key\(s\) \['stepz'\]; allowed: \[.*'steps'"),
    (["optim.lr=3"], r"override key 'optim.lr' must be out_dir or <section>.<field>"),
    (["train.lr"], r"override 'train.lr' must look like section.key=value"),
    (["model.residual=attnres"], r"ModelConfig.residual must be one of"),
    (["train.seq_len=4096"], r"train.seq_len=4096 is above the model's maximum model.max_seq_len=2048"),
])
def test_run_config_errors(tmp_path, overrides, pattern):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 2\n  num_kv_heads: 1\n"
                    "  intermediate_size: 64\n")
    with pytest.raises(ValueError, match=pattern):
        load_run_config(path, overrides)


def test_missing_and_bad_config_files(tmp_path):
    with pytest.raises(RunConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(RunConfigError, match="not valid YAML"):
        load_run_config(bad)
    with pytest.raises(RunConfigError, match="needs a 'model' section"):
        RunConfig.from_dict({"train": {}})


def test_bundled_configs_are_valid():
    from pathlib import Path

    import attnres

    root = Path(attnres.__file__).parent / "configs"
    files = sorted(root.glob("*.yaml")) + sorted((root / "paper").glob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        run = load_run_config(path)
        assert run.model.with_vocab_size(151936).num_layers >= 1


@pytest.mark.parametrize("field", ["lr", "grad_clip", "weight_decay", "expert_balance_rate"])
def test_infinite_or_nan_values_are_refused_by_name(field):
    for value in (float("inf"), float("nan")):
        with pytest.raises(TrainConfigError, match=rf"TrainConfig\.{field} must be"):
            TrainConfig(**{field: value})
