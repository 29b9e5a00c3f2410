"""Padded batches: every real token gets the logits and routing of its sequence run alone.

Routing mixes depth per token (method §5 "Inference"), so padding only concerns attention: positions
derived from the mask and padded keys masked out, in prefill and with either cache (attnres's
KVCache, transformers' DynamicCache). Checked in float64 for every variant of the table, left
padding (generation) and right padding (scoring). Transformers' own Qwen3 as a second reference is
in tests/hf/test_padding.py.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnres import AttnResLM, ModelConfig
from attnres.model import KVCache
from attnres.model.layers import padded_causal_mask, padded_positions
from attnres.residual import VARIANTS
from tests.helpers import activate_routing, exact_conversions, options_of

transformers = pytest.importorskip("transformers")

# Every row of the variant table with each exact conversion it accepts; 3 layers = 6 sub-layers,
# num_blocks 3 gives blocks of 2 sub-layers, so block boundaries fall inside the model.
CASES = [(name, 3 if variant.uses_blocks else None, exact)
         for name, variant in VARIANTS.items() for exact in (None, *exact_conversions(variant))]
IDS = [f"{name}-{exact}" for name, _, exact in CASES]
LENGTHS = (7, 4, 2)  # one full row, two padded ones; the shortest has more pads than tokens
VOCAB = 50
PAD = 0


def model_for(residual, num_blocks, exact, seed=0, routing_impl="auto"):
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                         intermediate_size=48, residual=residual,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact),
                         max_seq_len=32)
    model = AttnResLM(config).set_routing(routing_impl).double().eval()
    activate_routing(model.routers)
    return model


def sequences(lengths=LENGTHS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]


def pad(rows, side):
    """rows: 1-D id tensors -> (ids (B, T_max), attention_mask (B, T_max)), padded on `side`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        columns = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, columns], mask[i, columns] = row, 1
    return ids, mask


def real_columns(mask_row):
    return mask_row.nonzero().squeeze(1)


def new_cache(kind):
    return KVCache() if kind == "kvcache" else transformers.DynamicCache()


def test_the_mask_and_positions_of_a_padded_batch_by_hand():
    """Each query sees the real keys up to itself and its own key (so a left pad's row is never empty,
    which some SDPA kernels would turn into NaN); positions count the real tokens before."""
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0]])
    allowed = padded_causal_mask(mask, 4)
    assert allowed.shape == (2, 1, 4, 4) and allowed.dtype == torch.bool
    assert allowed[0, 0].int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert allowed[1, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]
    assert padded_positions(mask, 4).tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]
    extended = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1]])  # two new tokens after a cached prompt
    assert padded_causal_mask(extended, 2)[:, 0].int().tolist() == [[[0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]],
                                                                   [[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 1]]]
    assert padded_positions(extended, 2).tolist() == [[2, 3], [2, 3]]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_padded_prefill_gives_each_real_token_its_logits_alone(residual, num_blocks, exact, side):
    model = model_for(residual, num_blocks, exact)
    rows = sequences()
    ids, mask = pad(rows, side)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            torch.testing.assert_close(batched[i, real_columns(mask[i])], alone, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(batched).all()  # pads' own rows too: they flow through routing


@pytest.mark.parametrize("cache_kind", ["kvcache", "dynamic"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_padded_prefill_then_decoding_with_a_cache_equals_each_sequence_alone(residual, num_blocks, exact, side,
                                                                              cache_kind):
    """Prefill a padded prompt, then a chunk of 2 tokens and 2 single tokens per row, the mask extended
    by ones each time (as `generate` does): logits equal each sequence decoded alone with its own cache."""
    model = model_for(residual, num_blocks, exact)
    rows = sequences()
    steps = torch.randint(1, VOCAB, (len(rows), 4), generator=torch.Generator().manual_seed(2))
    chunks = [steps[:, :2], steps[:, 2:3], steps[:, 3:4]]
    ids, mask = pad(rows, side)
    with torch.no_grad():
        cache = new_cache(cache_kind)
        batched = [model(ids, attention_mask=mask, cache=cache).logits]
        for chunk in chunks:
            mask = torch.cat([mask, torch.ones_like(chunk)], dim=1)
            batched.append(model(chunk, attention_mask=mask, cache=cache).logits)
        for i, row in enumerate(rows):
            alone_cache = new_cache(cache_kind)
            alone = [model(row[None], cache=alone_cache).logits[0]]
            alone += [model(chunk[i:i + 1], cache=alone_cache).logits[0] for chunk in chunks]
            prompt_mask = mask[i, :ids.shape[1]]
            torch.testing.assert_close(batched[0][i, real_columns(prompt_mask)], alone[0], rtol=1e-10, atol=1e-10)
            for got, expected in zip(batched[1:], alone[1:]):
                torch.testing.assert_close(got[i], expected, rtol=1e-10, atol=1e-10)
    assert cache.get_seq_length() == ids.shape[1] + steps.shape[1]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("residual, num_blocks, exact", [c for c in CASES if c[0] != "standard"],
                         ids=[i for i, c in zip(IDS, CASES) if c[0] != "standard"])
def test_routing_weights_of_real_tokens_equal_the_unpadded_runs(residual, num_blocks, exact, side):
    model = model_for(residual, num_blocks, exact)
    rows = sequences()
    ids, mask = pad(rows, side)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, return_routing=True).routing
        assert len(batched) == len(model.routers)
        for i, row in enumerate(rows):
            alone = model(row[None], return_routing=True).routing
            for router, (got, expected) in enumerate(zip(batched, alone)):
                torch.testing.assert_close(got[i, real_columns(mask[i])], expected[0], rtol=1e-10, atol=1e-10,
                                           msg=f"router {router}")
                assert torch.isfinite(got[i]).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_loss_of_a_padded_batch_is_that_of_its_sequences_and_its_gradients_are_finite(side):
    """The padded batch's loss is the token-weighted mean of the sequences' own losses, whether padding
    is labelled -100 or not (a left pad's output never predicts the first real token), and its
    gradients are finite (a left pad's row sees only its own key, never nothing)."""
    model = model_for("delta_block", 3, "gate").train()
    rows = sequences()
    ids, mask = pad(rows, side)
    with torch.no_grad():
        targets = [len(r) - 1 for r in rows]
        expected = sum(model(r[None], labels=r[None]).loss * n for r, n in zip(rows, targets)) / sum(targets)
        unlabelled = model(ids, labels=ids, attention_mask=mask).loss
    loss = model(ids, labels=ids.masked_fill(mask == 0, -100), attention_mask=mask).loss
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(unlabelled, expected, rtol=1e-10, atol=1e-10)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


class AttentionCalls(TorchFunctionMode):
    """Records how scaled_dot_product_attention is called: (has an attn_mask, is_causal)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls.append((kwargs.get("attn_mask") is not None, kwargs.get("is_causal", False)))
        return func(*args, **kwargs)


def test_without_padding_no_mask_is_built():
    """No mask, or an all-ones one on the first call: the fast causal path (is_causal SDPA, no mask);
    a padded batch uses the mask in every attention layer."""
    model = model_for("block_attnres", 3, None)
    ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad():
        for attention_mask in (None, torch.ones(2, 6, dtype=torch.long)):
            with AttentionCalls() as recorder:
                model(ids, attention_mask=attention_mask)
            assert recorder.calls == [(False, True)] * 3
        cache = KVCache()
        model(ids, cache=cache)
        with AttentionCalls() as recorder:  # a decoded token sees every key: no mask either
            model(ids[:, :1], cache=cache)
        assert recorder.calls == [(False, False)] * 3
        with AttentionCalls() as recorder:
            model(ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]))
        assert recorder.calls == [(True, False)] * 3


def test_padded_decoding_on_a_device_reads_nothing_back():
    """A decoding step of a padded batch off the CPU reads no value back to the host: on the meta
    device any read-back (`.item()`, `bool()`, `.tolist()`) raises, and the step still completes.
    (The reference routing path: the lean ops' autocast query does not know the meta device.)"""
    model = model_for("delta_block", 3, "gate", routing_impl="reference").float()
    cache = KVCache()
    with torch.no_grad():
        model(torch.randint(1, VOCAB, (2, 5)), cache=cache)  # fills the cache on the CPU
        model.to("meta")
        cache.keys = {i: k.to("meta") for i, k in cache.keys.items()}
        cache.values = {i: v.to("meta") for i, v in cache.values.items()}
        mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6], device="meta")
        out = model(torch.ones(2, 1, dtype=torch.long, device="meta"), attention_mask=mask, cache=cache)
        assert out.logits.shape == (2, 1, VOCAB) and out.logits.device.type == "meta"
        with pytest.raises(RuntimeError, match="meta"):  # a first call does check values: the probe works
            model(torch.ones(2, 6, dtype=torch.long, device="meta"), attention_mask=mask)


def test_a_wrong_attention_mask_or_position_ids_is_refused_naming_the_expected_shape():
    model = model_for("standard", None, None)
    ids = torch.randint(1, VOCAB, (2, 4))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new positions\) = "
                                         r"\(2, 4\).*got \(2, 3\)"):
        model(ids, attention_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have shape .* = \(2, 4\).*got \(2, 1, 1, 4\)"):
        model(ids, attention_mask=torch.ones(2, 1, 1, 4, dtype=torch.bool))  # a 4-D mask is not taken
    with pytest.raises(ValueError, match=r"attention_mask must be a bool or integer tensor of shape \(2, 4\).*float32"):
        model(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"attention_mask must hold 1 \(real token\) and 0 \(padding\), got values "
                                         r"from 0 to 2"):
        model(ids, attention_mask=torch.tensor([[0, 1, 1, 2], [1, 1, 1, 1]]))
    cache = KVCache()
    model(ids, cache=cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape .* = \(2, 5\).*got \(2, 1\)"):
        model(ids[:, :1], cache=cache, attention_mask=torch.ones(2, 1, dtype=torch.long))  # must cover the cache
    with pytest.raises(ValueError, match=r"position_ids must have shape \(2, 4\) or \(1, 4\) like input_ids, "
                                         r"got \(4,\)"):
        model(ids, position_ids=torch.arange(4))
    with pytest.raises(ValueError, match="position_ids must be an integer tensor"):
        model(ids, position_ids=torch.zeros(2, 4))


def test_position_ids_given_override_the_ones_from_the_mask():
    """Explicit position_ids (what `generate` passes) are used: stretching them changes the logits, and
    passing the mask's own positions changes nothing."""
    model = model_for("full_attnres", None, None)
    ids, mask = pad(sequences(), "left")
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        from_mask = model(ids, attention_mask=mask).logits
        given = model(ids, attention_mask=mask, position_ids=positions).logits
        stretched = model(ids, attention_mask=mask, position_ids=2 * positions).logits
    torch.testing.assert_close(given, from_mask, rtol=0, atol=0)
    assert not torch.allclose(stretched[0], from_mask[0])  # rotary is relative: a shift alone would not show
