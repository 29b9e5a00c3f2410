"""DenseFormer (residual "denseformer", method §7.2): its sources for each k x p layout, its
configuration checks, training, what it refuses, and its pipeline payload. The logits against an
independent reference are in test_variants.py; every other path (compile, cache, Hugging Face,
analysis) takes it from the variant table like any other variant."""

import pytest
import torch

from attnres import AttnResLM, ConfigError, ModelConfig
from attnres.distributed.pipeline_layout import PipelineConfig, build_layout
from attnres.report.variant_names import variant_name
from attnres.residual import StatePolicy
from tests.helpers import train_losses


SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2, intermediate_size=64,
             max_seq_len=32)


def config(**options):
    """A DenseFormer config with these options (`DenseFormerOptions`: dilation, period)."""
    return ModelConfig(**SHAPE, residual="denseformer", residual_options=options)


@pytest.mark.parametrize("dilation, period, expected", [
    (1, 1, [["e", "x1"], ["e", "x1", "x2"], ["e", "x1", "x2", "x3"], ["e", "x1", "x2", "x3", "x4"],
            ["e", "x1", "x2", "x3", "x4", "x5"], ["e", "x1", "x2", "x3", "x4", "x5", "x6"]]),
    # dilation 2: the states of the current index's parity; the embedding with even layers only
    (2, 1, [["x1"], ["e", "x2"], ["x1", "x3"], ["e", "x2", "x4"], ["x1", "x3", "x5"], ["e", "x2", "x4", "x6"]]),
    # period 3: averages after layers 3 and 6 only
    (1, 3, [["e", "x1", "x2", "x3"], ["e", "x1", "x2", "x3", "x4", "x5", "x6"]]),
    (2, 3, [["x1", "x3"], ["e", "x2", "x4", "x6"]]),
])
def test_each_average_reads_the_states_the_paper_names(dilation, period, expected):
    model = AttnResLM(config(dilation=dilation, period=period))
    assert model.residual.source_names() == expected
    assert [router.alpha.shape[0] for router in model.routers] == [len(names) for names in expected]
    seen = []
    for r, router in enumerate(model.routers):
        router.register_forward_hook(lambda m, args, out, r=r: seen.append((r, len(args[0]))))
    model(torch.randint(0, 64, (2, 5)))
    assert seen == [(r, len(names)) for r, names in enumerate(expected)]
    assert StatePolicy(6, dilation, period).mixer_layers == [t for t in range(1, 7) if t % period == 0]


def test_layout_fields_are_checked_and_named():
    assert variant_name(config(dilation=2, period=3).to_dict()) == "denseformer (2x3)"
    assert config(dilation=2, period=3).variant == "denseformer (2x3)"
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options.dilation must be an integer from 1 to "
                                          r"num_layers = 6, got 7"):
        config(dilation=7)
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options.period must be a positive integer"):
        config(period=0)
    # The options of another variant: unknown options of its own, and old flat fields (from_dict, YAML)
    # that apply only to the variants that have them.
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['period'\] of residual='full_attnres'"):
        ModelConfig(**SHAPE, residual="full_attnres", residual_options={"period": 2})
    with pytest.raises(ConfigError, match=r"denseformer_period applies only to residual in \['denseformer'\]"):
        ModelConfig.from_dict({**SHAPE, "residual": "full_attnres", "denseformer_period": 2})
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['query'\] of residual='denseformer'; "
                                          r"its options: \['dilation', 'period'\]"):
        config(query="input_dependent")
    with pytest.raises(ConfigError, match=r"router_query applies only to residual in \['full_attnres', "
                                          r"'block_attnres', 'delta_attnres', 'delta_block'\]"):
        ModelConfig.from_dict({**SHAPE, "residual": "denseformer", "router_query": "input_dependent"})
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['num_blocks'\] of residual='denseformer'"):
        config(num_blocks=2)
    with pytest.raises(ConfigError, match="num_blocks applies only to"):
        ModelConfig.from_dict({**SHAPE, "residual": "denseformer", "num_blocks": 2})


def test_it_trains_and_every_average_learns():
    torch.manual_seed(0)
    model = AttnResLM(config(dilation=2))
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    start = [router.alpha.detach().clone() for router in model.routers]
    losses = train_losses(model, batch, 10)
    assert losses[-1] < losses[0] - 0.3
    assert all(not torch.equal(router.alpha, a) for router, a in zip(model.routers, start))
    assert {name for name, _ in model.routing_parameters()} == {f"residual.routers.{m}.alpha" for m in range(6)}


def test_pipeline_stages_carry_the_stream_and_every_state():
    layout = build_layout(config(), PipelineConfig(microbatch_size=1, seq_len=8, layers_per_stage=(2, 4)), num_ranks=2)
    (edge,) = layout.edges
    assert (edge.has_stream, edge.has_partial, edge.num_sources) == (True, False, 3)  # y_2 and x_0, x_1, x_2
