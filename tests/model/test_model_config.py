"""ModelConfig rejects bad input at construction, naming the field and the allowed values."""

import pytest

from attnres import AttnResLM, ConfigError, ModelConfig
from attnres.common.errors import InputError
from attnres.model import valid_num_blocks

BASE = dict(vocab_size=100, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2, intermediate_size=64)


def make(**overrides):
    return ModelConfig(**{**BASE, **overrides})


def test_valid_configs_build():
    assert make().head_dim == 8
    assert make(head_dim=16).head_dim == 16
    for residual in ("block_attnres", "delta_block"):
        assert make(residual=residual, residual_options={"num_blocks": 4}).residual_options.num_blocks == 4
    assert make(residual="delta_block", residual_options={"num_blocks": 3, "exact_conversion": "gate"}
                ).residual_options.exact_conversion == "gate"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("overrides, pattern", [
    (dict(residual="attnres"), r"residual must be one of \['standard', 'full_attnres', 'block_attnres', "
                               r"'delta_attnres', 'delta_block', 'denseformer', 'hyper_connections', 'mhc'\], got 'attnres'"),
    (dict(residual="block_attnres"), r"residual_options.num_blocks is required for residual='block_attnres'.*"
                                     r"\[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="delta_block"), r"residual_options.num_blocks is required .* \[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="block_attnres", residual_options=dict(num_blocks=0)),
     r"residual_options.num_blocks must be an integer from 1 to .*12.*got 0"),
    (dict(residual="block_attnres", residual_options=dict(num_blocks=-2)),
     r"residual_options.num_blocks must be an integer from 1 to .*got -2"),
    (dict(residual="delta_block", residual_options=dict(num_blocks=13)),
     r"residual_options.num_blocks must be an integer from 1 to .*12.*got 13"),
    (dict(residual="block_attnres", residual_options=dict(num_blocks=5)),
     r"residual_options.num_blocks=5 gives blocks of 3 sub-layers and only 4 blocks .*"
     r"allowed values: \[1, 2, 3, 4, 6, 12\]"),
    (dict(residual="standard", residual_options=dict(num_blocks=2)),
     r"residual_options: unknown option\(s\) \['num_blocks'\] of residual='standard'; its options: \[\]"),
    (dict(residual="full_attnres", residual_options=dict(num_blocks=2)),
     r"unknown option\(s\) \['num_blocks'\] of residual='full_attnres'; "
     r"its options: \['query', 'weights', 'key_norm'\]"),
    (dict(residual="block_attnres", residual_options=dict(num_blocks=2, exact_conversion="gate")),
     r"unknown option\(s\) \['exact_conversion'\] of residual='block_attnres'; "
     r"its options: \['num_blocks', 'query', 'weights', 'key_norm'\]"),
    (dict(residual="delta_block", residual_options=dict(num_blocks=2, exact_conversion="zero")),
     r"residual_options.exact_conversion must be None or one of \['gate', 'partial'\], got 'zero'"),
    (dict(num_kv_heads=3), r"num_kv_heads must divide num_heads=4; allowed values: \[1, 2, 4\], got 3"),
    (dict(num_heads=5), r"num_kv_heads must divide num_heads=5|head_dim: hidden_size=32 is not divisible"),
    (dict(num_heads=3, num_kv_heads=1), r"head_dim: hidden_size=32 is not divisible by num_heads=3"),
    (dict(head_dim=7), r"head_dim must be even"),
    (dict(vocab_size=0), r"vocab_size must be a positive integer, or 'auto' until a run's tokenizer is read, got 0"),
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


@pytest.mark.parametrize("fields, pattern", [
    (dict(residual="standard", num_blocks=2), r"num_blocks applies only to residual in "
                                              r"\['block_attnres', 'delta_block'\]"),
    (dict(residual="full_attnres", num_blocks=2), r"num_blocks applies only"),
    (dict(residual="block_attnres", num_blocks=2, exact_conversion="gate"),
     r"exact_conversion applies only to residual in \['delta_block'\]"),
])
def test_an_option_of_another_variant_is_refused_by_name(fields, pattern):
    # a YAML `model:` section (the variant's options at the top level, or fields written before they were typed)
    with pytest.raises(ConfigError, match=pattern):
        ModelConfig.from_dict({**BASE, **fields})


def test_routing_impl_is_checked_where_it_is_set():
    # how routing is computed is a run setting now (TrainConfig.routing_impl), set on a model with set_routing
    with pytest.raises(InputError, match=r"routing_impl must be one of "
                                         r"\['auto', 'reference', 'lean', 'triton', 'fused'\], got 'cuda'"):
        AttnResLM(make()).set_routing("cuda")


def test_valid_num_blocks_follows_the_ceil_rule():
    assert valid_num_blocks(12) == [1, 2, 3, 4, 6, 12]
    assert valid_num_blocks(10) == [1, 2, 3, 4, 5, 10]  # 3 -> 4, 4, 2; 4 -> 3, 3, 3, 1
    config = make(num_layers=5, residual="block_attnres", residual_options={"num_blocks": 4})
    assert config.residual_options.num_blocks == 4


def test_dict_round_trip_and_unknown_keys():
    config = make(residual="delta_block", residual_options={"num_blocks": 6, "exact_conversion": "partial"})
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['hidden'\]"):
        ModelConfig.from_dict({**BASE, "hidden": 3})


def test_config_is_immutable():
    with pytest.raises(AttributeError):
        make().residual = "full_attnres"
