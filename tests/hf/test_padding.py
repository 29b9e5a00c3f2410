"""Padded batches through transformers: batched greedy generate equals one prompt at a time, and a
standard attnres model matches transformers' own Qwen3 on padded batches (logits and generate)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from tests.helpers import activate_routing, options_of  # noqa: E402
from tests.model.test_decoder import hf_twin, small_config  # noqa: E402
from tests.model.test_padding import CASES, IDS, pad, real_columns  # noqa: E402

PAD = 0
PROMPT_LENGTHS = (6, 3, 1, 4)


def tiny(residual, num_blocks, exact, seed=0):
    torch.manual_seed(seed)
    config = AttnResConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual=residual,
                           residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact),
                           max_position_embeddings=64, pad_token_id=PAD)
    model = AttnResForCausalLM(config).double().eval()
    activate_routing(model.model.routers)
    return model


def prompts(vocab, lengths=PROMPT_LENGTHS, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]


def generate(model, ids, attention_mask=None, new=6):
    return model.generate(ids, attention_mask=attention_mask, max_new_tokens=new, do_sample=False,
                          pad_token_id=PAD, eos_token_id=None)


@pytest.mark.parametrize("residual, num_blocks, exact", CASES, ids=IDS)
def test_batched_greedy_generate_with_left_padding_equals_one_prompt_at_a_time(residual, num_blocks, exact):
    model = tiny(residual, num_blocks, exact)
    rows = prompts(64)
    ids, mask = pad(rows, "left")
    batched = generate(model, ids, mask)
    continuations = batched[:, ids.shape[1]:]
    for i, row in enumerate(rows):
        alone = generate(model, row[None])
        assert torch.equal(continuations[i], alone[0, len(row):]), f"prompt {i}"
    assert len({tuple(c.tolist()) for c in continuations}) > 1  # the prompts really lead to different text


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logits_match_transformers_qwen3(side):
    """transformers' Qwen3 handles the same padded batch its own way (its mask functions and positions
    from the mask): a standard attnres model with its weights gives the same logits at real tokens."""
    config = small_config()
    hf, ours = hf_twin(config)
    rows = prompts(config.vocab_size)
    ids, mask = pad(rows, side)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what transformers' generate passes: Qwen3 does not derive them
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask).logits
    for i in range(len(rows)):
        columns = real_columns(mask[i])
        torch.testing.assert_close(got[i, columns], expected[i, columns], rtol=1e-5, atol=1e-5)


def test_batched_generate_matches_transformers_qwen3():
    config = small_config()
    hf, ours = hf_twin(config)
    wrapped = AttnResForCausalLM(AttnResConfig.from_model_config(config, pad_token_id=PAD)).eval()
    wrapped.model.load_state_dict(ours.state_dict())
    ids, mask = pad(prompts(config.vocab_size), "left")
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=PAD,
                           eos_token_id=None)
    assert torch.equal(generate(wrapped, ids, mask), expected)


def test_a_padded_forward_returns_a_cache_that_decodes_on():
    """forward with a mask and use_cache, then a decoding step with the extended mask (what generate
    does): the step's logits equal the full padded forward's last column."""
    model = tiny("delta_block", 3, "partial")
    ids, mask = pad(prompts(64), "left")
    with torch.no_grad():
        prefill = model(ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        step = model(ids[:, -1:], attention_mask=mask, cache=prefill.cache, use_cache=True)
        full = model(ids, attention_mask=mask, use_cache=False)
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-10, atol=1e-10)


def test_a_mask_of_the_wrong_shape_is_refused():
    model = tiny("standard", None, None)
    ids = torch.randint(1, 64, (2, 5))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, cached \+ new positions\) = "
                                         r"\(2, 5\).*got \(1, 5\)"):
        model(ids, attention_mask=torch.ones(1, 5, dtype=torch.long))
