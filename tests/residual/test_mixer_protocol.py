"""A depth-mixing method added through the mixer protocol alone: a mixer class and a variant-table row.

The toy method averages the sources with fixed, equal weights (no parameters, no softmax). Nothing
in attnres knows it: the test registers it, and configs, the model, training and analysis pick it
up from the variant table.
"""

import math
from dataclasses import dataclass

import pytest
import torch

from attnres import AttnResLM, ConfigError, ModelConfig
from attnres.analysis import collect_depth_stats
from attnres.residual import (VARIANTS, BlockCount, Variant, VariantOptions, option, register_variant,
                              unregister_variant)
from attnres.methods import DepthMixer
from tests.helpers import train_losses


class UniformAverage(DepthMixer):
    """sum_i V_i / n with weights 1/n: the method a router reduces to at zero queries, frozen."""

    def __init__(self, hidden_size: int, eps: float, gated: bool = False) -> None:
        super().__init__()
        if gated:
            raise ValueError("UniformAverage has no gate")

    def forward(self, sources, need_weights=True):
        mixed = sum(sources) / len(sources)
        weights = torch.full((*sources[0].shape[:-1], len(sources)), 1.0 / len(sources)) if need_weights else None
        return mixed, weights


@dataclass(frozen=True, kw_only=True)
class UniformBlockOptions(BlockCount):
    """The toy block variant's one option: how many blocks (no router options: the mixer has none)."""


@dataclass(frozen=True, kw_only=True)
class UniformGatedOptions(UniformBlockOptions):
    """... and a gate on every mixer, asked for the way Delta Block asks for it."""

    exact_conversion: str = option(None, "'gate': a zero scalar gate per mixer", kind=str, choices=("gate",),
                                   nullable=True, label="[{value}]")

    @property
    def gated(self) -> bool:
        return self.exact_conversion == "gate"


@pytest.fixture
def uniform_variants():
    added = [register_variant(Variant("uniform_average", "replace", "sublayers", "d", mixer=UniformAverage,
                                      options=VariantOptions)),
             register_variant(Variant("uniform_block", "add", "blocks", "D", mixer=UniformAverage,
                                      options=UniformBlockOptions))]
    yield added
    for variant in added:
        unregister_variant(variant.name)
    assert "uniform_average" not in VARIANTS


SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=64)


def config(residual, num_blocks=None, **options):
    if num_blocks is not None:
        options["num_blocks"] = num_blocks
    return ModelConfig(**SHAPE, residual=residual, residual_options=options)


@pytest.mark.parametrize("residual, num_blocks", [("uniform_average", None), ("uniform_block", 3)])
@pytest.mark.parametrize("impl", ["reference", "lean"])
def test_a_registered_mixer_trains(uniform_variants, residual, num_blocks, impl):
    torch.manual_seed(0)
    model = AttnResLM(config(residual, num_blocks)).set_routing(impl)
    assert all(isinstance(m, UniformAverage) for m in model.routers)
    assert model.routing_parameters() == []  # no parameters of its own
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = train_losses(model, batch, 12)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.5
    stats = collect_depth_stats(model, [batch])  # analysis reads it through the same protocol
    assert stats.source_names == model.residual.source_names()
    for names, weights in zip(stats.source_names, stats.mean_weights):
        assert weights == pytest.approx([1 / len(names)] * len(names))


def test_uniform_average_computes_the_mean_of_the_right_sources(uniform_variants):
    torch.manual_seed(0)
    model = AttnResLM(config("uniform_average")).eval()
    ids = torch.randint(0, 64, (2, 5))
    seen = []
    for r, mixer in enumerate(model.routers):
        mixer.register_forward_hook(lambda m, args, out, r=r: seen.append((r, len(args[0]), out[0])))
    model(ids)
    # Full AttnRes's sources: router s sees the embedding and s outputs; the final router all 2L + 1.
    assert [(r, n) for r, n, _ in seen] == [(s, s + 1) for s in range(7)]


def test_config_validation_follows_the_table(uniform_variants):
    with pytest.raises(ConfigError, match=r"ModelConfig.residual_options.num_blocks is required for "
                                          r"residual='uniform_block'"):
        config("uniform_block")
    with pytest.raises(ConfigError, match=r"residual must be one of \[.*'uniform_average', 'uniform_block'\]"):
        config("uniform")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['exact_conversion'\] of residual='uniform_block'"):
        config("uniform_block", 3, exact_conversion="gate")
    with pytest.raises(ConfigError, match=r"exact_conversion applies only to residual in \['delta_block'\]"):
        ModelConfig.from_dict({**SHAPE, "residual": "uniform_block", "num_blocks": 3, "exact_conversion": "gate"})


def test_a_mixer_refuses_what_it_cannot_do():
    gated = register_variant(Variant("uniform_gated", "add", "blocks", "D", mixer=UniformAverage,
                                     options=UniformGatedOptions))
    try:
        with pytest.raises(ValueError, match="UniformAverage has no gate"):
            AttnResLM(config("uniform_gated", 3, exact_conversion="gate"))
    finally:
        unregister_variant(gated.name)


def test_registering_twice_and_bad_rows_are_refused(uniform_variants):
    with pytest.raises(ValueError, match="already registered"):
        register_variant(Variant("uniform_average", "replace", "sublayers", mixer=UniformAverage))
    with pytest.raises(ValueError, match=r"Variant.mode must be one of \['none', 'replace', 'add', 'average', 'streams'\]"):
        Variant("bad", "mix", "sublayers")
    with pytest.raises(ValueError, match="sources are needed exactly when mode is not 'none'"):
        Variant("bad", "add")


def test_the_rest_of_attnres_reads_the_registered_variant(uniform_variants, tmp_path):
    """Hugging Face save/load/generate, the benchmark's options and the pipeline layout take the new
    variant from the table, with no change of their own."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    import attnres.hf  # noqa: F401  (registers the Auto classes)
    from attnres.bench.bench_config import resolve_config
    from attnres.distributed.pipeline_layout import PipelineConfig, build_layout
    from attnres.hf import AttnResConfig, AttnResForCausalLM

    torch.manual_seed(0)
    hf = AttnResForCausalLM(AttnResConfig.from_model_config(config("uniform_block", 3))).eval()
    hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompt = torch.randint(0, 64, (1, 4))
    assert torch.equal(loaded.generate(prompt, max_new_tokens=3, do_sample=False),
                       hf.generate(prompt, max_new_tokens=3, do_sample=False))
    assert resolve_config(quick=True, variants="uniform_block").variants == ("uniform_block",)
    layout = build_layout(config("uniform_block", 3), PipelineConfig(num_microbatches=2, microbatch_size=1, seq_len=8),
                          num_ranks=3)
    # blocks of 2 sub-layers: stage boundaries at layers 1 and 2 carry the stream and 2, 3 completed sources
    assert [(e.has_stream, e.num_sources, e.has_partial) for e in layout.edges] == [(True, 2, False), (True, 3, False)]
