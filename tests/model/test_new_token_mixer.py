"""A new token mixer with options, from one file: sliding-window attention, its options and its row
of the layer-type table.

Nothing in attnres names it. This file registers it through the public table
(`attnres.model.token_mixers.register_token_mixer`), and `ModelConfig.layer_types`, the decoder,
training, the Hugging Face classes, the FLOPs count, cached decoding and a two-stage pipeline take
it from there. docs/how-to/add-a-method.md walks through a simpler one.

Where the window lives: in the row's options (`WindowOptions`), given as
`ModelConfig.mixer_options["window_attention"]`, validated when the config is built and saved with it
in a config.json; a process that loads such a model registers the same row first, as for a
registered residual variant.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.common.errors import InputError
from attnres.model import KVCache
from attnres.model.model_config import LAYER_TYPES, ConfigError
from attnres.model.attention import Attention
from attnres.model.token_mixers import (TOKEN_MIXERS, TokenMixerType, even_head_dim, register_token_mixer,
                                        unregister_token_mixer)
from tests.distributed.spawn import run_workers
from tests.helpers import train_losses

WINDOW = 3  # keys a query sees: itself and the WINDOW - 1 before it (the configs below)


@dataclass(frozen=True)
class WindowOptions:
    """The options of "window_attention" layers."""

    window: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise InputError(f"WindowOptions.window must be a positive integer, got {self.window!r}")

    @classmethod
    def from_dict(cls, values: "WindowOptions | dict") -> "WindowOptions":
        return values if isinstance(values, cls) else cls(**values)


class SlidingWindowAttention(Attention):
    """Grouped-query attention (the same projections, norms and rotary embedding) in which the query
    at position i sees keys i - window + 1 .. i only. Its cache is Attention's key/value cache (every
    position is kept; the window is applied in the mask), so decoding needs a cache that reports its
    length (KVCache, not FastGenerator's static cache)."""

    not_compiled = "sliding-window attention"

    def __init__(self, config: ModelConfig, window: int) -> None:
        super().__init__(config)
        self.window = window

    def flops_per_token(self, seq_len: int) -> int:
        """Q K^T and A V over at most `window` keys per query (a kernel that skips the rest)."""
        return 4 * min(self.window, seq_len) * self.num_heads * self.head_dim

    def forward(self, x, rope, cache=None, layer_idx=0, mask=None, real=None):
        """As Attention.forward, with the window ANDed into the mask over cached + new positions."""
        if cache is not None and not hasattr(cache, "get_seq_length"):
            raise InputError("SlidingWindowAttention needs a cache that reports its length (a KVCache)")
        t = x.shape[1]
        past = 0 if cache is None else int(cache.get_seq_length(layer_idx))
        query = torch.arange(past, past + t, device=x.device)[:, None]
        key = torch.arange(past + t, device=x.device)[None, :]
        window = (key <= query) & (key > query - self.window)  # (T, T_past + T)
        mask = window if mask is None else mask & window
        return super().forward(x, rope, cache, layer_idx, mask, real)


def build_sliding_window(config: ModelConfig, index: int) -> SlidingWindowAttention:
    return SlidingWindowAttention(config, config.mixer_options["window_attention"].window)


ROW = TokenMixerType("window_attention", build_sliding_window, options=WindowOptions, check=even_head_dim)
SHAPE = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
             max_seq_len=32, mixer_options={"window_attention": {"window": WINDOW}})
LAYERS = ["window_attention", "full_attention"]


def register() -> None:
    if ROW.name not in TOKEN_MIXERS:
        register_token_mixer(ROW)


@pytest.fixture
def sliding_window():
    register()
    yield
    unregister_token_mixer(ROW.name)


def config(residual: str = "block_attnres", **changes) -> ModelConfig:
    options = {"num_blocks": 2} if residual == "block_attnres" else None
    return ModelConfig(**{**SHAPE, "layer_types": LAYERS, **changes}, residual=residual, residual_options=options)


def test_the_layer_type_is_allowed_once_registered_and_builds_its_mixer():
    with pytest.raises(ConfigError, match="window_attention"):
        config()
    register()
    try:
        assert "window_attention" in LAYER_TYPES
        model = AttnResLM(config())
        assert [type(layer.self_attn) for layer in model.layers] == [SlidingWindowAttention, Attention]
        assert model.first_attention_layer == 0  # its cache holds keys and values, so it tells the length
        with pytest.raises(InputError, match="already registered"):
            register_token_mixer(ROW)
    finally:
        unregister_token_mixer(ROW.name)
    assert "window_attention" not in LAYER_TYPES


def test_its_options_are_checked_when_the_config_is_built_and_saved_with_it(sliding_window):
    assert config().mixer_options == {"window_attention": WindowOptions(window=WINDOW)}
    assert ModelConfig.from_dict(config().to_dict()) == config()
    with pytest.raises(ConfigError, match=r"ModelConfig.mixer_options\['window_attention'\]: WindowOptions.window "
                                          r"must be a positive integer, got 0"):
        config(mixer_options={"window_attention": {"window": 0}})
    with pytest.raises(ConfigError, match=r"has 'window_attention' layers but ModelConfig.mixer_options"
                                          r"\['window_attention'\] is None"):
        config(mixer_options=None)
    with pytest.raises(ConfigError, match=r"ModelConfig.mixer_options must be None or a mapping of layer types with "
                                          r"options of their own \(\['window_attention'\]\)"):
        config(mixer_options={"full_attention": {}})
    with pytest.raises(ConfigError, match="head_dim must be even"):  # the row's check: it rotates by RoPE
        config(layer_types=["window_attention"] * 2, head_dim=5)


def test_a_query_sees_only_its_window(sliding_window):
    torch.manual_seed(0)
    mixer = AttnResLM(config()).layers[0].self_attn
    x = torch.randn(2, 10, 32)
    rope = AttnResLM(config()).rotary(torch.arange(10), x.dtype)
    changed = x.clone()
    changed[:, 2] += 1.0  # position 2 is in the windows of queries 2 .. 2 + WINDOW - 1 only
    with torch.no_grad():
        before, after = mixer(x, rope), mixer(changed, rope)
    moved = (before - after).abs().amax(dim=(0, 2)) > 0
    assert moved.tolist() == [i in range(2, 2 + WINDOW) for i in range(10)]


def test_it_trains_and_its_gradients_flow(sliding_window):
    torch.manual_seed(0)
    model = AttnResLM(config())
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = train_losses(model, batch, 12)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.5
    model.zero_grad()
    model(batch, labels=batch).loss.backward()
    for name, parameter in model.layers[0].self_attn.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_its_flops_are_counted(sliding_window):
    from attnres.model.flops import flops_per_token

    counted = flops_per_token(config(), seq_len=32)
    full = flops_per_token(config(layer_types=None, mixer_options=None), seq_len=32)
    heads, head_dim = 4, 8
    assert counted.attention == 4 * WINDOW * heads * head_dim + 4 * 32 * heads * head_dim
    assert full.forward - counted.forward == 4 * (32 - WINDOW) * heads * head_dim  # same projections
    assert flops_per_token(config(), seq_len=2).attention == 2 * 4 * 2 * heads * head_dim  # window > seq_len


def test_it_saves_and_loads_through_the_hugging_face_classes(sliding_window, tmp_path):
    import attnres.hf  # noqa: F401  (registers the Auto classes)
    from attnres.hf import AttnResConfig, AttnResForCausalLM

    torch.manual_seed(0)
    hf = AttnResForCausalLM(AttnResConfig.from_model_config(config())).eval()
    hf.save_pretrained(tmp_path)
    loaded = AttnResForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.to_model_config() == hf.config.to_model_config()
    assert type(loaded.model.layers[0].self_attn) is SlidingWindowAttention
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(loaded(ids).logits, hf(ids).logits)
    # transformers' generate decodes with a cache built from the token mixers (AttnResForCausalLM.new_cache),
    # and its greedy tokens are those of decoding without one.
    cached = loaded.generate(ids, max_new_tokens=5, do_sample=False)
    uncached = loaded.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False)
    assert cached.shape == (2, 14) and torch.equal(cached, uncached)


@pytest.mark.parametrize("pieces", [[6, 1, 1, 1, 1], [1] * 10, [4, 3, 2, 1]])
def test_decoding_with_a_cache_equals_the_full_forward(sliding_window, pieces):
    torch.manual_seed(0)
    model = AttnResLM(config()).eval()
    ids = torch.randint(0, 64, (2, sum(pieces)), generator=torch.Generator().manual_seed(2))
    cache, outs, start = KVCache(), [], 0
    with torch.no_grad():
        full = model(ids).logits
        for size in pieces:  # a prefill, then one token (or a few) at a time
            outs.append(model(ids[:, start:start + size], cache=cache).logits)
            start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-5, atol=1e-6)
    assert cache.get_seq_length() == sum(pieces)


def _pipeline_matches_one_process(rank: int, world_size: int) -> None:
    """Two stages on two ranks (GPipe): the loss of the unsplit model."""
    from attnres.distributed.pipeline import build_pipeline
    from attnres.distributed.pipeline_layout import PipelineConfig

    register()  # a spawned process imports this file afresh
    torch.manual_seed(0)
    model = AttnResLM(config())
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (4, 8), generator=generator)
    labels = torch.randint(0, 64, ids.shape, generator=generator)
    reference = copy.deepcopy(model)(ids, labels=labels).loss.detach()
    pipe = build_pipeline(model, PipelineConfig(schedule="gpipe", num_microbatches=2, microbatch_size=2, seq_len=8))
    loss = pipe.step(ids, labels)
    if pipe.has_last:
        torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)


def test_a_two_stage_pipeline_gives_one_process_loss(sliding_window):
    run_workers(_pipeline_matches_one_process, 2)


def test_a_model_of_window_layers_alone_is_allowed_its_cache_tells_the_length(sliding_window):
    model = AttnResLM(config(layer_types=["window_attention"] * 2))
    assert model.first_attention_layer == 0


def test_a_row_whose_module_keeps_another_cache_state_is_refused_when_built():
    from attnres.model.cache import RECURRENT_STATE

    row = register_token_mixer(TokenMixerType("sliding_attention", lambda config, index: SlidingWindowAttention(
        config, WINDOW), cache_state=RECURRENT_STATE))
    try:
        with pytest.raises(ConfigError, match="needs at least one layer that caches keys and values"):
            config(layer_types=["sliding_attention"] * 2, mixer_options=None)
        with pytest.raises(InputError, match="the row's cache_state 'recurrent'"):
            AttnResLM(config(layer_types=["sliding_attention", "full_attention"], mixer_options=None))
    finally:
        unregister_token_mixer(row.name)
