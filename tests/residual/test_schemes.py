"""One scheme class per routing mode, and what the scheme answers for the rest of attnres: which
mixers a pipeline stage owns, what travels between sub-layers, how to read a mixer's sources and
how to label its mixers. Nothing outside `attnres.residual` switches on a mode or a variant name."""

import pytest
import torch

from attnres.residual import (VARIANTS, AveragingScheme, RoutedScheme, StandardScheme, StreamScheme, build_residual)
from attnres.report.plots import mixer_rows

OPTIONS = {"block_attnres": {"num_blocks": 2}, "delta_block": {"num_blocks": 2}}
CLASSES = {"none": StandardScheme, "replace": RoutedScheme, "add": RoutedScheme, "average": AveragingScheme,
           "streams": StreamScheme}
LAYERS = 4


def scheme(residual):
    return build_residual(residual, OPTIONS.get(residual), num_layers=LAYERS, hidden_size=8)


@pytest.mark.parametrize("residual", list(VARIANTS))
def test_each_mode_has_its_class(residual):
    built = scheme(residual)
    assert type(built) is CLASSES[VARIANTS[residual].mode] and built.mode == VARIANTS[residual].mode


@pytest.mark.parametrize("residual", list(VARIANTS))
def test_pipeline_stages_own_every_mixer_once(residual):
    built = scheme(residual)
    for cut in range(1, LAYERS):
        owned = built.stage_mixers(0, cut, False) + built.stage_mixers(cut, LAYERS, True)
        assert sorted(owned) == list(range(built.num_routers)), cut


@pytest.mark.parametrize("residual", list(VARIANTS))
def test_the_recorded_mixer_labels_are_what_reports_read_from_older_files(residual):
    built = scheme(residual)
    assert (built.mixer_labels(), built.mixer_axis) == mixer_rows(built.source_names())
    assert len(built.mixer_labels()) == built.num_routers


def test_what_travels_between_sub_layers():
    assert [scheme(r).keeps_stream for r in ("standard", "full_attnres", "delta_attnres", "denseformer", "mhc")] == \
        [True, False, True, True, False]
    assert scheme("mhc").keeps_streams and not scheme("full_attnres").keeps_streams
    with_query = build_residual("full_attnres", num_layers=LAYERS, hidden_size=8, query="input_dependent")
    assert with_query.keeps_stream  # the query reads x_s, so "replace" keeps it
    assert [scheme(r).source_size for r in ("delta_attnres", "block_attnres", "denseformer")] == [1, 4, 2]


def test_a_stream_mixers_sources_are_its_streams():
    built = scheme("hyper_connections")
    streams = torch.randn(2, 3, 4, 8)
    split = built.split_sources(streams)
    assert len(split) == 4 and torch.equal(split[2], streams[:, :, 2])
    assert torch.equal(built.join_sources(split), streams)
    sources = [torch.randn(2, 3, 8) for _ in range(3)]
    assert scheme("full_attnres").join_sources(scheme("full_attnres").split_sources(sources)) == sources


def test_a_bf16_output_enters_the_stream_and_its_block_sum_converted_once():
    """Delta Block adds each sub-layer output to the stream and to its block sum, both fp32 under
    autocast. The output is converted once, so its gradient is the two fp32 gradients summed and
    then rounded once to bf16, not each rounded and the two added in bf16."""
    built = scheme("delta_block")
    torch.manual_seed(0)
    state = built.start(torch.randn(2, 3, 8))
    delta = torch.randn(2, 3, 8).to(torch.bfloat16).requires_grad_()
    built.after(0, state, delta)
    assert state.stream.dtype == state.partial.dtype == torch.float32
    g_stream, g_partial = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    torch.autograd.backward([state.stream, state.partial], [g_stream, g_partial])
    assert torch.equal(delta.grad, (g_stream + g_partial).to(torch.bfloat16))
