"""`attnres convert` of a tiny Kimi Linear checkpoint whose tokenizer is Kimi's tiktoken files: the
converted directory's tokenizer loads with AutoTokenizer (no remote code), encodes like tiktoken,
keeps the chat template, and generation stops at the end token; a tiktoken.model that cannot be
rebuilt stops the conversion before any weight is read, in one line."""

import json

import pytest
import torch

from attnres.cli import main
from tests.data.helpers import SPECIAL, synthetic_ranks, tiktoken_reference, write_kimi_tokenizer
from tests.hf.helpers import assert_generates_like_the_source

transformers = pytest.importorskip("transformers")
pytest.importorskip("tiktoken")

END = SPECIAL.index("<|im_end|>")  # its id is len(ranks) + END


def tiny_kimi(vocab_size: int, ids: dict):
    """transformers' Kimi Linear, 2 layers (delta attention, then MLA with experts), seeded."""
    config = transformers.KimiLinearConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, linear_num_heads=2, linear_head_dim=8,
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
        initializer_range=0.2, tie_word_embeddings=False, **ids)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def make_end_token_the_greedy_choice(model, prompt, end_id, step=3, steps=12):
    """Swap the output rows of `end_id` and of the token greedy decoding first produces at `step` or
    later (one not produced before): decoding is unchanged up to there, then picks `end_id`."""
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, eos_token_id=None,
                             pad_token_id=None)[0, prompt.shape[1]:].tolist()
    assert end_id not in out
    chosen = next(t for i, t in enumerate(out) if i >= step and t not in out[:i])
    with torch.no_grad():
        rows = model.lm_head.weight
        rows[[chosen, end_id]] = rows[[end_id, chosen]].clone()


@pytest.fixture(scope="module")
def kimi_source(tmp_path_factory):
    """(a tiny Kimi Linear checkpoint with a synthetic Kimi tokenizer, its model, the reference encoding)."""
    ranks = synthetic_ranks(200)
    n = len(ranks)
    ids = dict(bos_token_id=n, pad_token_id=n + 1, eos_token_id=n + END)
    model = tiny_kimi(n + 258, ids)
    encoding = tiktoken_reference(ranks)
    prompt = torch.tensor([encoding.encode("<|im_user|>the river runs<|im_end|><|im_assistant|>",
                                           allowed_special="all")])
    make_end_token_the_greedy_choice(model, prompt, n + END)
    directory = tmp_path_factory.mktemp("kimi-tiktoken")
    model.generation_config = transformers.GenerationConfig(**ids)
    model.save_pretrained(directory)
    write_kimi_tokenizer(directory, ranks)
    return directory, model, encoding


def test_the_converted_kimi_model_has_a_tokenizer_that_loads_encodes_and_stops(kimi_source, tmp_path):
    source, model, encoding = kimi_source
    out = tmp_path / "converted"
    assert main(["convert", str(source), "--residual", "block_attnres", "--option", "num_blocks=2",
                 "--out", str(out)]) == 0
    assert not (out / "tiktoken.model").exists() and not (out / "tokenization_kimi.py").exists()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)  # no trust_remote_code
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    for text in ["the river runs past the mill", "中文English混合 naïve 🙂", "  12345\n\n", "a<|im_end|>b[BOS]"]:
        ids = encoding.encode(text, allowed_special="all")
        assert tokenizer.encode(text) == ids and tokenizer.decode(ids) == text

    prompt_text = tokenizer.apply_chat_template([{"role": "user", "content": "the river runs"}], tokenize=False,
                                                add_generation_prompt=True)
    assert prompt_text == "<|im_user|>the river runs<|im_end|><|im_assistant|>"
    prompt = tokenizer(prompt_text, return_tensors="pt").input_ids
    loaded = assert_generates_like_the_source(model, out, prompt)  # the same ids, EOS reached early
    assert tokenizer.eos_token_id == loaded.generation_config.eos_token_id == encoding.encode_single_token("<|im_end|>")
    with torch.no_grad():
        reply = loaded.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1]:]
    assert reply[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(reply).endswith("<|im_end|>")
    assert not tokenizer.decode(reply, skip_special_tokens=True).endswith("<|im_end|>")


def test_a_tiktoken_file_that_cannot_be_rebuilt_stops_the_conversion_first(kimi_source, tmp_path, capsys, monkeypatch):
    import attnres.hf.export as export

    source, _, _ = kimi_source
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in source.iterdir():
        (damaged / path.name).write_bytes(path.read_bytes())
    with open(damaged / "tiktoken.model", "a") as handle:
        handle.write("garbage\n")

    def never(*args, **kwargs):
        raise AssertionError("the weights were converted before the tokenizer was checked")

    monkeypatch.setattr(export, "convert_checkpoint", never)
    out = tmp_path / "converted"
    assert main(["convert", str(damaged), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "tiktoken.model line" in error and "original tiktoken.model" in error
    assert not out.exists()
