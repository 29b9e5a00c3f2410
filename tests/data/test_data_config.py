"""DataConfig: defaults, and every invalid value refused with a message naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnres.data import DataConfig, DataError


def test_defaults_and_frozen():
    config = DataConfig()
    assert (config.source, config.tokenizer, config.vocab_size, config.val_fraction) == ("demo", "bpe", 4096, 0.05)
    assert (config.hf_split, config.text_field, config.id_field) == ("train", "text", "id")
    assert config.split_salt == "attnres"
    assert config.hf_config is None and config.max_documents is None and config.cache_dir is None
    with pytest.raises(Exception):
        config.vocab_size = 10  # type: ignore[misc]
    with pytest.raises(TypeError):
        DataConfig("demo")  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"source": ""}, "DataConfig.source must be 'demo', 'python-docs', 'fineweb-edu'"),
    ({"source": 3}, "DataConfig.source"),
    ({"source": "hf:"}, "DataConfig.source 'hf:'"),
    ({"hf_config": ""}, "DataConfig.hf_config"),
    ({"hf_split": ""}, "DataConfig.hf_split"),
    ({"text_field": None}, "DataConfig.text_field"),
    ({"id_field": ""}, "DataConfig.id_field"),
    ({"max_documents": 0}, "DataConfig.max_documents must be None or a positive integer"),
    ({"max_documents": True}, "DataConfig.max_documents"),
    ({"source": "fineweb-edu"}, "DataConfig.max_documents is required with source='fineweb-edu'"),
    ({"tokenizer": ""}, "DataConfig.tokenizer must be 'bpe'"),
    ({"vocab_size": 259}, "DataConfig.vocab_size must be an integer >= 260"),
    ({"vocab_size": 4096.0}, "DataConfig.vocab_size"),
    ({"val_fraction": 0.0}, "DataConfig.val_fraction must be a number with 0 < val_fraction < 1"),
    ({"val_fraction": 1}, "DataConfig.val_fraction"),
    ({"val_fraction": "0.1"}, "DataConfig.val_fraction"),
    ({"split_salt": None}, "DataConfig.split_salt"),
    ({"cache_dir": ""}, "DataConfig.cache_dir"),
])
def test_invalid_values_name_the_field(kwargs, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)) as info:
        DataConfig(**kwargs)
    assert isinstance(info.value, ValueError)
    assert repr(next(iter(kwargs.values()))) in str(info.value) or "required" in str(info.value)


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "env"))
    assert DataConfig().cache_root() == tmp_path / "env"
    assert DataConfig(cache_dir=str(tmp_path / "explicit")).cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("ATTNRES_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert DataConfig().cache_root() == tmp_path / "home" / ".cache" / "attnres"


def test_path_like_values_become_strings(tmp_path):
    config = DataConfig(source=tmp_path, cache_dir=Path(tmp_path))  # type: ignore[arg-type]
    assert config.source == str(tmp_path) and config.cache_dir == str(tmp_path)
