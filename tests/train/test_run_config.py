"""One pass from a run file to a typed run (attnres.train.run_config): the model section is a ModelConfig
built once, its vocabulary an explicit unknown until the trainer resolves it from the tokenizer."""

import pytest
import yaml

from attnres import AttnResLM, ModelConfig
from attnres.model import ConfigError
from attnres.residual import ResidualScheme
from attnres.train import RunConfig, Trainer, load_run_config


def counting(monkeypatch, cls, method: str) -> list:
    """Calls of cls.method from now on, one entry each."""
    calls, original = [], getattr(cls, method)

    def counted(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, counted)
    return calls


def test_a_fresh_run_builds_its_model_config_once_and_its_model_twice(write_config, monkeypatch):
    path, _ = write_config(steps=1)
    configs = counting(monkeypatch, ModelConfig, "__post_init__")
    models = counting(monkeypatch, AttnResLM, "__init__")
    schemes = counting(monkeypatch, ResidualScheme, "__init__")
    run = load_run_config(path, ["model.num_blocks=4"])
    assert (len(configs), len(models), len(schemes)) == (1, 0, 1)  # the routing check: a scheme on meta
    Trainer(run)._release()
    # the trainer resolves the vocabulary without building the config again, then builds the model on the
    # meta device for its memory check and once for training
    assert (len(configs), len(models), len(schemes)) == (1, 2, 3)


def test_the_vocabulary_is_unknown_until_resolved_and_a_model_is_not_built_before():
    run = RunConfig.from_dict({"model": dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                             intermediate_size=64)})
    assert run.model.vocab_size == "auto" and run.to_dict()["model"]["vocab_size"] == "auto"
    with pytest.raises(ConfigError, match="vocab_size is 'auto', a vocabulary not yet known"):
        AttnResLM(run.model)
    resolved = run.model.with_vocab_size(300)
    assert resolved.vocab_size == 300 and resolved.with_vocab_size(5) is resolved  # a stated size stays
    with pytest.raises(ConfigError, match=r"ModelConfig.vocab_size must be a positive integer, or 'auto'"):
        ModelConfig(**{**run.model.to_dict(), "vocab_size": 0})


def test_an_override_in_todays_form_wins_over_a_file_in_an_earlier_versions(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                                  intermediate_size=64, residual="hyper_connections", hc_streams=2)}))
    run = load_run_config(path, ["model.residual_options.streams=4"])
    assert run.model.residual_options.streams == 4
