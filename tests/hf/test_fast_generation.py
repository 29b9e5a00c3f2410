"""`generate(..., cache_implementation="static")` and `generate_fast`: attnres's compiled static-cache
decoding behind transformers' `generate`, with the same greedy output as the plain call.

Most tests run the fixed-shape step eagerly (`disable_compile=True`, transformers' own switch);
the one marked `compile` compiles it (aot_eager, fullgraph=True).
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from attnres.generation import GenerationResult  # noqa: E402
from tests.helpers import activate_routing, options_of  # noqa: E402

PROMPT = torch.tensor([[5, 17, 42, 8, 23]])


def tiny(residual="block_attnres", num_blocks=2, exact=None, eos=None):
    """A 2-layer model with non-uniform routing, weights scaled so logits are far from ties (and an
    untied head: tied, this tiny model repeats its last token)."""
    torch.manual_seed(0)
    config = AttnResConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual=residual,
                           residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact),
                           max_position_embeddings=64, eos_token_id=eos,
                           tie_word_embeddings=False)
    model = AttnResForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    activate_routing(model.model.routers)
    model.generation_config.eos_token_id = eos
    return model


def both(model, *args, **kwargs):
    """(plain generate, generate with the static cache and the eager fixed-shape step)."""
    with torch.no_grad():
        plain = model.generate(*args, **kwargs)
    fast = model.generate(*args, cache_implementation="static", disable_compile=True, **kwargs)
    return plain, fast


@pytest.mark.parametrize("residual, num_blocks, exact", [("standard", None, None), ("full_attnres", None, None),
                                                         ("block_attnres", 2, None), ("delta_block", 2, "partial")])
def test_greedy_static_generate_equals_plain_generate(residual, num_blocks, exact):
    model = tiny(residual, num_blocks, exact)
    plain, fast = both(model, PROMPT, max_new_tokens=20, do_sample=False)
    assert plain.shape == (1, 25) and fast.tolist() == plain.tolist()
    assert len(set(plain[0, 5:].tolist())) >= 4  # a varied continuation, not one token repeated
    # No max_new_tokens: transformers' default max_length of 20 counts new tokens.
    plain, fast = both(model, PROMPT, do_sample=False)
    assert plain.shape == (1, 25) and fast.tolist() == plain.tolist()


def test_end_tokens_min_new_tokens_and_a_left_padded_batch_match_plain_generate():
    model = tiny()
    free = model.generate(PROMPT, max_new_tokens=20, do_sample=False)[0, 5:].tolist()
    eos = next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])  # first made at step >= 3
    plain, fast = both(model, PROMPT, max_new_tokens=20, do_sample=False, eos_token_id=[63, eos])
    assert plain.shape[1] < 25 and fast.tolist() == plain.tolist()  # stopped early, at the same token
    plain, fast = both(model, PROMPT, max_new_tokens=20, do_sample=False, eos_token_id=eos,
                       min_new_tokens=free.index(eos) + 2)
    assert fast.tolist() == plain.tolist()
    ids = torch.tensor([[0, 0, 0, 5, 17, 42], [3, 9, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    plain, fast = both(model, ids, attention_mask=mask, max_new_tokens=15, do_sample=False, eos_token_id=eos,
                       pad_token_id=0)
    assert fast.tolist() == plain.tolist()


def test_the_generation_config_can_ask_for_the_static_cache():
    model = tiny()
    expected = model.generate(PROMPT, max_new_tokens=12, do_sample=False)
    config = transformers.GenerationConfig(max_new_tokens=12, do_sample=False, cache_implementation="static",
                                           disable_compile=True)
    assert model.generate(PROMPT, generation_config=config).tolist() == expected.tolist()
    result = model.generate_fast(PROMPT, max_new_tokens=12, do_sample=False, disable_compile=True)
    assert isinstance(result, GenerationResult) and result.sequences.tolist() == expected.tolist()
    assert result.new_tokens == 12 and result.decode_steps == 11 and result.compile_mode is None


def test_sampling_options_reach_the_fast_loop():
    model = tiny()
    greedy = model.generate(PROMPT, max_new_tokens=10, do_sample=False)
    one = model.generate(PROMPT, max_new_tokens=10, do_sample=True, top_k=1, temperature=0.7,
                         cache_implementation="static", disable_compile=True)
    assert one.tolist() == greedy.tolist()  # top_k=1 keeps only the argmax
    torch.manual_seed(0)
    hot = model.generate(PROMPT, max_new_tokens=10, do_sample=True, temperature=50.0, top_k=0,
                         cache_implementation="static", disable_compile=True)
    assert hot.tolist() != greedy.tolist()


@pytest.mark.parametrize("options, named", [({"num_beams": 2}, "num_beams"),
                                             ({"repetition_penalty": 1.3}, "repetition_penalty"),
                                             ({"return_dict_in_generate": True}, "return_dict_in_generate"),
                                             ({"use_cache": False}, "use_cache"),
                                             ({"streamer": object()}, "streamer")])
def test_options_the_fast_loop_cannot_honour_are_refused_by_name(options, named):
    with pytest.raises(ValueError, match=named):
        tiny().generate(PROMPT, max_new_tokens=4, cache_implementation="static", **options)


@pytest.mark.compile
def test_compiled_static_generate_equals_plain_generate():
    torch._dynamo.reset()
    model = tiny("delta_block", 2, "gate")
    expected = model.generate(PROMPT, max_new_tokens=12, do_sample=False)
    compile_config = transformers.CompileConfig(backend="aot_eager", mode=None)
    result = model.generate_fast(PROMPT, max_new_tokens=12, do_sample=False, compile_config=compile_config)
    assert result.sequences.tolist() == expected.tolist()
    assert result.compile_s > 0 and result.decode_steps == 10
    again = model.generate(PROMPT, max_new_tokens=12, do_sample=False, cache_implementation="static",
                           compile_config=compile_config)  # the kept generator: compiled already
    assert again.tolist() == expected.tolist()
