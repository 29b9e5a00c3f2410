"""ModelConfig rejects bad input at construction, naming the field and the allowed values."""

import pytest

from attnres import ConfigError, ModelConfig
from attnres.model import valid_num_blocks

BASE = dict(vocab_size=100, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2, intermediate_size=64)


def make(**overrides):
    return ModelConfig(**{**BASE, **overrides})


def test_valid_configs_build():
    assert make().head_dim == 8
    assert make(head_dim=16).head_dim == 16
    for residual in ("block_attnres", "delta_block"):
        assert make(residual=residual, num_blocks=4).num_blocks == 4
    assert make(residual="delta_block", num_blocks=3, exact_conversion="gate").exact_conversion == "gate"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("overrides, pattern", [
    (dict(residual="attnres"), r"residual must be one of \['standard', 'full_attnres', 'block_attnres', "
                               r"'delta_attnres', 'delta_block', 'denseformer', 'hyper_connections', 'mhc'\], got 'attnres'"),
    (dict(residual="block_attnres"), r"num_blocks is required for residual='block_attnres'; "
                                     r"allowed values for num_layers=6: \[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="delta_block"), r"num_blocks is required .* \[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="block_attnres", num_blocks=0), r"num_blocks must be an integer from 1 to .*12.*got 0"),
    (dict(residual="block_attnres", num_blocks=-2), r"num_blocks must be an integer from 1 to .*got -2"),
    (dict(residual="delta_block", num_blocks=13), r"num_blocks must be an integer from 1 to .*12.*got 13"),
    (dict(residual="block_attnres", num_blocks=5), r"num_blocks=5 gives blocks of 3 sub-layers and only 4 "
                                                   r"blocks .*allowed values: \[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="standard", num_blocks=2), r"num_blocks applies only to residual in "
                                              r"\['block_attnres', 'delta_block'\]"),
    (dict(residual="full_attnres", num_blocks=2), r"num_blocks applies only"),
    (dict(residual="block_attnres", num_blocks=2, exact_conversion="gate"),
     r"exact_conversion applies only to residual='delta_block'"),
    (dict(residual="delta_block", num_blocks=2, exact_conversion="zero"),
     r"exact_conversion must be None or one of \['gate', 'partial'\], got 'zero'"),
    (dict(routing_impl="cuda"), r"routing_impl must be one of \['auto', 'reference', 'lean', 'triton', 'fused'\], got 'cuda'"),
    (dict(num_kv_heads=3), r"num_kv_heads must divide num_heads=4; allowed values: \[1, 2, 4\], got 3"),
    (dict(num_heads=5), r"num_kv_heads must divide num_heads=5|head_dim: hidden_size=32 is not divisible"),
    (dict(num_heads=3, num_kv_heads=1), r"head_dim: hidden_size=32 is not divisible by num_heads=3"),
    (dict(head_dim=7), r"head_dim must be even"),
    (dict(vocab_size=0), r"vocab_size must be a positive integer, got 0"),
    (dict(hidden_size=-8), r"hidden_size must be a positive integer, got -8"),
    (dict(num_layers=0), r"num_layers must be a positive integer, got 0"),
    (dict(num_heads=0), r"num_heads must be a positive integer"),
    (dict(num_kv_heads=0), r"num_kv_heads must be a positive integer"),
    (dict(intermediate_size=0), r"intermediate_size must be a positive integer"),
    (dict(head_dim=0), r"head_dim must be a positive integer"),
    (dict(max_seq_len=0), r"max_seq_len must be a positive integer"),
    (dict(hidden_size=32.0), r"hidden_size must be a positive integer, got 32.0"),
    (dict(norm_eps=0.0), r"norm_eps must be a positive number"),
    (dict(rope_theta=-1.0), r"rope_theta must be a positive number"),
    (dict(init_std=0), r"init_std must be a positive number"),
    (dict(tie_embeddings="yes"), r"tie_embeddings must be True or False"),
])
def test_bad_values_raise_naming_field_and_allowed_values(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        make(**overrides)


def test_valid_num_blocks_follows_the_ceil_rule():
    assert valid_num_blocks(12) == [1, 2, 3, 4, 6, 12]
    assert valid_num_blocks(10) == [1, 2, 3, 4, 5, 10]  # 3 -> 4, 4, 2; 4 -> 3, 3, 3, 1
    assert make(num_layers=5, residual="block_attnres", num_blocks=4).num_blocks == 4


def test_dict_round_trip_and_unknown_keys():
    config = make(residual="delta_block", num_blocks=6, exact_conversion="partial")
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['hidden'\]"):
        ModelConfig.from_dict({**BASE, "hidden": 3})


def test_config_is_immutable():
    with pytest.raises(AttributeError):
        make().residual = "full_attnres"
