"""Shared steps of the conversion tests."""

import random

import torch
import transformers

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres.cli import main
from attnres.data import train_bpe
from tests.train.conftest import WORDS


def assert_converts_to_source_logits(source_path, source_model, args, out, vocab_size):
    """`attnres convert SOURCE ARGS --out OUT`, reload with from_pretrained, compare with the source model.

    Returns the loaded model; its tokenizer files must sit beside it.
    """
    assert main(["convert", str(source_path), *args, "--out", str(out)]) == 0
    assert (out / "tokenizer_config.json").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, source_model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    return loaded


def greedy_eos_setup(model, prompt, steps=12, stop_at=3):
    """(token ids the source generates greedily from `prompt` with no EOS, an id to declare as EOS):
    the token first produced at step `stop_at`, so generation with that EOS stops early."""
    config = model.generation_config
    config.eos_token_id, config.pad_token_id = None, None
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=steps, do_sample=False, min_new_tokens=steps)[0, prompt.shape[1]:]
    fresh = [i for i, t in enumerate(out.tolist()) if t not in out.tolist()[:i] and t not in prompt[0].tolist()]
    step = next(i for i in fresh if i >= stop_at)
    return out, int(out[step])


def assert_generates_like_the_source(source_model, converted_dir, prompt, max_new_tokens=12):
    """The converted model has the source's special-token ids and generation defaults, and greedy
    `generate` stops at EOS exactly where the source's does (before max_new_tokens)."""
    loaded = transformers.AutoModelForCausalLM.from_pretrained(converted_dir).eval()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(loaded.config, key) == getattr(source_model.config, key), key
        assert getattr(loaded.generation_config, key) == getattr(source_model.generation_config, key), key
    with torch.no_grad():
        expected = source_model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        got = loaded.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
    assert expected.shape[1] < prompt.shape[1] + max_new_tokens, "the source never reached EOS: a weak test"
    assert got.tolist() == expected.tolist()
    return loaded


def tiny_source_and_corpus(root):
    """(a tiny transformers Qwen3, seeded; a BPE tokenizer of its vocabulary size, trained on the corpus;
    root/corpus, a folder of 40 text documents), for a test to save as it needs."""

    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(300)) for _ in range(40)]
    for i, text in enumerate(texts):
        (corpus / f"d{i:02d}.txt").write_text(text)
    tokenizer = train_bpe(texts, vocab_size=300)
    config = transformers.Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    source = transformers.Qwen3ForCausalLM(config)
    return source, tokenizer, corpus

