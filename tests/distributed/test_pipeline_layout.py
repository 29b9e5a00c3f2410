"""PipelineConfig validation and the static stage layout (no process group needed)."""

from __future__ import annotations

import pytest

from attnres.distributed.pipeline_layout import PipelineConfig, PipelineConfigError, build_layout
from attnres.model.model_config import ModelConfig
from tests.helpers import options_of


def _model(residual="block_attnres", num_blocks=4, num_layers=8) -> ModelConfig:
    return ModelConfig(vocab_size=32, hidden_size=16, num_layers=num_layers, num_heads=2, num_kv_heads=1,
                       intermediate_size=24, residual=residual, residual_options=options_of(num_blocks=num_blocks))


def _config(**overrides) -> PipelineConfig:
    values = dict(schedule="interleaved1f1b", stages_per_rank=2, num_microbatches=4, microbatch_size=1, seq_len=8)
    return PipelineConfig(**{**values, **overrides})


def test_layout_places_stages_round_robin_and_caches_what_the_rank_already_holds():
    # 8 layers, blocks of 4 sub-layers (2 layers), 2 ranks x 2 stages of 2 layers: b = 4, 8, 12
    layout = build_layout(_model(), _config(), num_ranks=2)
    assert layout.layer_bounds == (0, 2, 4, 6, 8)
    assert [layout.rank_of(j) for j in range(4)] == [0, 1, 0, 1]
    assert [layout.has_later_local_stage(j) for j in range(4)] == [True, True, False, False]
    assert list(layout.sublayers(1)) == [4, 5, 6, 7]
    assert [e.num_sources for e in layout.edges] == [2, 3, 4]
    assert [e.first_sent for e in layout.edges] == [0, 2, 3]  # n(end of stage k+1-P): n(4), n(8)
    assert [e.num_tensors for e in layout.edges] == [2, 1, 1]
    uncached = build_layout(_model(), _config(cache=False), num_ranks=2)
    assert [e.num_tensors for e in uncached.edges] == [2, 3, 4]


def test_partial_and_stream_travel_where_the_variant_has_them():
    model = _model("delta_block", num_blocks=2)  # blocks of 8 sub-layers
    layout = build_layout(model, _config(allow_partial_blocks=True), num_ranks=2)
    assert [(e.has_stream, e.has_partial) for e in layout.edges] == [(True, True), (True, False), (True, True)]
    assert [e.num_tensors for e in layout.edges] == [3, 1 + 2 - 1, 1 + 1 + 2 - 2]
    standard = build_layout(_model("standard", None), _config(), num_ranks=2)
    assert [e.num_tensors for e in standard.edges] == [1, 1, 1]


def test_uneven_split_by_layers_per_stage():
    layout = build_layout(_model("delta_attnres", None, num_layers=6),
                          _config(schedule="1f1b", stages_per_rank=1, layers_per_stage=(2, 4)), num_ranks=2)
    assert layout.layer_bounds == (0, 2, 6)
    assert layout.edges[0].num_tensors == 1 + 5  # stream + e, d0 .. d3


@pytest.mark.parametrize("overrides,match", [
    (dict(schedule="zero_bubble"), r"PipelineConfig.schedule must be one of \['gpipe', '1f1b', 'interleaved1f1b'\]"),
    (dict(schedule="gpipe", stages_per_rank=2), r"PipelineConfig.stages_per_rank must be 1 for schedule='gpipe'"),
    (dict(num_microbatches=0), "PipelineConfig.num_microbatches must be a positive integer"),
    (dict(cache="yes"), "PipelineConfig.cache must be True or False"),
])
def test_config_errors_name_the_field(overrides, match):
    with pytest.raises(PipelineConfigError, match=match):
        _config(**overrides)


@pytest.mark.parametrize("model,overrides,ranks,match", [
    (_model(), {}, 1, "at least 2 ranks"),
    (_model(num_layers=6, num_blocks=3), {}, 2, r"num_layers=6 does not split evenly into 4 stages; give "
                                                r"PipelineConfig.layers_per_stage"),
    (_model(), dict(layers_per_stage=(2, 2, 2)), 2, r"layers_per_stage must be 4 positive integers .* summing to "
                                                    r"ModelConfig.num_layers=8, got \(2, 2, 2\)"),
    (_model(num_layers=2, num_blocks=2), {}, 2, "4 stages .* need at least one layer each"),
    (_model(), dict(seq_len=4096), 2, "seq_len=4096 exceeds ModelConfig.max_seq_len=2048"),
    # blocks of 4 sub-layers = 2 layers; a boundary at layer 3 cuts a block
    (_model(), dict(layers_per_stage=(3, 1, 2, 2)), 2,
     r"boundaries at layers \[3\], inside a block of 4 sub-layers .* must be at layers \[2, 4, 6\], or set "
     r"PipelineConfig.allow_partial_blocks=True"),
])
def test_layout_errors_name_the_field_and_allowed_values(model, overrides, ranks, match):
    with pytest.raises(PipelineConfigError, match=match):
        build_layout(model, _config(**overrides), num_ranks=ranks)
