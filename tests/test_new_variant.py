"""A new depth-mixing method from one file: a mixer, its options dataclass and a variant-table row.

Nothing in attnres names the method or its options. This file registers it through the public API
(`attnres.register_variant`, `attnres.VariantOptions`, `attnres.option`), and the model, training,
the Hugging Face classes, `attnres compare` with a YAML preset, its report, the FLOPs count and a
two-stage pipeline take it from the variant table. docs/how-to/add-a-method.md walks through the
same method.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import pytest
import torch
import yaml
from torch import nn

import attnres
from attnres.residual import VARIANTS, unregister_variant
from tests.distributed.spawn import run_workers
from tests.helpers import train_losses


class RecentMean(attnres.DepthMixer):
    """The mean of the latest `window` sources (all of them when there are fewer), times a learned
    gain when `learned`."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, gated: bool = False, *, window: int = 2,
                 learned: bool = False) -> None:
        super().__init__()
        if gated:
            raise ValueError("RecentMean has no gate")
        self.hidden_size, self.window = hidden_size, window
        self.gain = nn.Parameter(torch.ones(())) if learned else None

    def reset_parameters(self) -> None:
        if self.gain is not None:
            nn.init.ones_(self.gain)

    def forward(self, sources, need_weights=True):
        n = len(sources)
        k = min(self.window, n)
        scale = 1.0 / k if self.gain is None else self.gain / k
        mixed = scale * sum(sources[n - k:])
        weights = None
        if need_weights:  # (B, T, n) fp32: 1/k (times the gain) on the latest k sources
            weights = torch.zeros(*sources[0].shape[:-1], n, dtype=torch.float32, device=sources[0].device)
            weights[..., n - k:] = float(scale.detach() if torch.is_tensor(scale) else scale)
        return mixed, weights

    def flops_per_token(self, num_sources: int) -> attnres.methods.MixerFlops:
        return attnres.methods.MixerFlops(vector=2 * min(self.window, num_sources) * self.hidden_size)


class StreamRecentMean(RecentMean):
    """The same, averaged with the sub-layer's current input x_s: a mixer that reads the stream."""

    needs_stream = True

    def forward(self, sources, need_weights=True, stream=None):
        mixed, weights = super().forward(sources, need_weights)
        return 0.5 * (mixed + stream), weights


@dataclass(frozen=True, kw_only=True)
class RecentMeanOptions(attnres.VariantOptions):
    """Recent mean's options."""

    window: int = attnres.option(2, "how many of the latest sources to average", label="(k={value})", mixer="window")
    learned: bool = attnres.option(False, "scale the mean by a learned gain", label="[learned]", mixer="learned")


ROWS = [attnres.Variant("recent_mean", "add", "sublayers", "d", mixer=RecentMean, options=RecentMeanOptions,
                        method="tests/test_new_variant.py"),
        attnres.Variant("recent_mean_stream", "replace", "sublayers", "d", mixer=StreamRecentMean,
                        options=RecentMeanOptions, method="tests/test_new_variant.py")]
SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
             max_seq_len=32)


def register() -> None:
    for row in ROWS:
        if row.name not in VARIANTS:
            attnres.register_variant(row)


@pytest.fixture
def recent_mean():
    register()
    yield
    for row in ROWS:
        unregister_variant(row.name)


def config(residual: str = "recent_mean", **options) -> attnres.ModelConfig:
    return attnres.ModelConfig(**SHAPE, residual=residual, residual_options=options)


def test_the_options_are_typed_validated_and_stored(recent_mean):
    model_config = config(window=3, learned=True)
    assert model_config.residual_options == RecentMeanOptions(window=3, learned=True)
    assert model_config.variant == "recent_mean (k=3) [learned]"
    assert config().residual_options == RecentMeanOptions()  # the defaults
    assert attnres.ModelConfig.from_dict({**SHAPE, "residual": "recent_mean", "window": 3}) == config(window=3)
    with pytest.raises(attnres.ConfigError, match=r"ModelConfig.residual_options.window must be a positive "
                                                  r"integer, got 0"):
        config(window=0)
    with pytest.raises(attnres.ConfigError, match=r"ModelConfig.residual_options.learned must be True or False"):
        config(learned="yes")
    with pytest.raises(attnres.ConfigError, match=r"unknown option\(s\) \['num_blocks'\] of "
                                                  r"residual='recent_mean'; its options: \['window', 'learned'\]"):
        config(num_blocks=2)


def test_it_builds_its_mixers_with_their_options_and_trains(recent_mean):
    torch.manual_seed(0)
    model = attnres.AttnResLM(config(window=3, learned=True))
    assert [type(m).__name__ for m in model.routers] == ["RecentMean"] * 4  # mode "add": no final mixer
    assert all(m.window == 3 and m.gain is not None for m in model.routers)
    assert [name for name, _ in model.routing_parameters()] == [f"residual.routers.{s}.gain" for s in range(4)]
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    routing = model(batch[:1], return_routing=True).routing
    assert routing[3][0, 0].tolist() == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3])  # sources e, d0, d1, d2
    losses = train_losses(model, batch, 12)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.5
    assert all(m.gain.item() != 1.0 for m in model.routers)  # the gains trained


def test_its_flops_are_counted(recent_mean):
    from attnres.model.flops import flops_per_token

    counted = flops_per_token(config(window=3), seq_len=32)
    # sub-layer s mixes min(3, s + 1) of its s + 1 sources: 1, 2, 3, 3 sources of D each, 2 FLOPs per value
    assert counted.mixing_vector == 2 * 32 * (1 + 2 + 3 + 3) and counted.mixing_matmul == 0
    standard = flops_per_token(attnres.ModelConfig(**SHAPE), seq_len=32)
    assert counted.forward == standard.forward + counted.mixing_vector


def test_it_saves_and_loads_with_its_options_through_auto_model(recent_mean, tmp_path):
    from transformers import AutoModelForCausalLM

    import attnres.hf  # noqa: F401  (registers the Auto classes)
    from attnres.hf import AttnResConfig, AttnResForCausalLM

    torch.manual_seed(0)
    hf = AttnResForCausalLM(AttnResConfig.from_model_config(config(window=3, learned=True))).eval()
    with torch.no_grad():
        for s, mixer in enumerate(hf.model.routers):
            mixer.gain.fill_(0.5 + 0.1 * s)
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["residual"] == "recent_mean" and saved["residual_options"] == {"window": 3, "learned": True}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.to_model_config() == hf.config.to_model_config()
    assert [m.gain.item() for m in loaded.model.routers] == pytest.approx([0.5, 0.6, 0.7, 0.8])
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(loaded(ids).logits, hf(ids).logits)


def test_compare_runs_it_from_a_yaml_preset_and_names_it_by_its_options(recent_mean, tmp_path, monkeypatch):
    from attnres.cli import main

    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    preset = {"description": "a new variant", "seeds": 1, "cost": {"repeats": 5, "warmup": 0},
              "variants": [{"residual": "standard"}, {"residual": "recent_mean", "window": 3, "learned": True}],
              "run": {"model": {**SHAPE, "vocab_size": "auto"},
                      "data": {"source": "demo", "tokenizer": "bpe", "vocab_size": 512, "max_documents": 60,
                               "val_fraction": 0.1},
                      "train": {"steps": 6, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
                                "eval_every": 3, "eval_batches": 2, "checkpoint_every": 6, "precision": "fp32",
                                "tensorboard": False, "progress": False}}}
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(preset))
    out = tmp_path / "report"
    assert main(["compare", "--preset", str(path), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [v["name"] for v in results["variants"]] == ["standard", "recent_mean (k=3) [learned]"]
    run = results["variants"][1]["runs"][0]
    assert math.isfinite(run["final_val_loss"])
    assert results["summary"]["recent_mean (k=3) [learned]"]["residual_options"] == {"window": 3, "learned": True}
    assert "recent_mean (k=3) [learned]" in (out / "report.md").read_text()


def _pipeline_matches_one_process(rank: int, world_size: int, residual: str) -> None:
    """Two stages on two ranks (GPipe): the loss of the unsplit model."""
    from attnres.distributed.pipeline import build_pipeline
    from attnres.distributed.pipeline_layout import PipelineConfig

    register()  # a spawned process imports this file afresh
    torch.manual_seed(0)
    model = attnres.AttnResLM(config(residual, window=2, learned=True))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (4, 8), generator=generator)
    labels = torch.randint(0, 64, ids.shape, generator=generator)
    reference = copy.deepcopy(model)(ids, labels=labels).loss.detach()
    pipe = build_pipeline(model, PipelineConfig(schedule="gpipe", num_microbatches=2, microbatch_size=2, seq_len=8))
    assert pipe.layout.edges[0].has_stream == (residual == "recent_mean_stream" or
                                               attnres.residual.VARIANTS[residual].mode != "replace")
    loss = pipe.step(ids, labels)
    if pipe.has_last:
        torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("residual", ["recent_mean", "recent_mean_stream"])
def test_a_two_stage_pipeline_gives_one_process_loss(recent_mean, residual):
    """The mixer that reads the stream (needs_stream) in replacement mode: the scheme keeps the
    stream, so the pipeline stages send it."""
    run_workers(_pipeline_matches_one_process, 2, residual)
