"""A tiktoken tokenizer (Kimi's tiktoken.model) rebuilt as tokenizer.json: it encodes and decodes as
tiktoken does with the same ranks, pattern and special tokens; the split pattern is read from the
checkpoint's code without running it; what cannot be rebuilt fails or warns in one line."""

from __future__ import annotations

import json
import warnings

import pytest

from attnres.data import DataError, Tokenizer
from attnres.data.tiktoken_files import (KIMI_PATTERN, KIMI_PATTERN_PARTS, SPECIAL_SLOTS, TIKTOKEN_FILE,
                                         check_tiktoken_source, pattern_in_code, split_pattern, write_fast_tokenizer)
from attnres.data.tokenizer import copy_tokenizer_files
from tests.data.helpers import kimi_code, synthetic_ranks, tiktoken_reference, write_kimi_tokenizer

tiktoken = pytest.importorskip("tiktoken")
transformers = pytest.importorskip("transformers")

# ASCII, accents, Han, kana, Cyrillic, emoji, contractions, digit runs, whitespace runs, special tokens in the text
SAMPLES = ["The quick brown fox jumps over the lazy dog.", "It's 2024; we're 1234567 strong, THEY'LL see!",
           "中文English混合, 日本語のテキスト and naïve café — Ünïcödé Жук 🙂🚀", "", " ", "  \n\n\t  x \r\n y   ",
           "def f(x):\n    return x ** 2  # squared\n", "3.14159 + 2.71828 = 5.85987", "a" * 70,
           "<|im_user|>hi<|im_end|><|im_assistant|>[BOS]hello[EOS] [EOS]x", "<|reserved_token_{reserved}|> tail"]


@pytest.fixture(scope="module")
def ranks():
    ranks = synthetic_ranks(300)
    assert len(ranks) == 556  # 256 bytes and every merge learnt
    return ranks


@pytest.fixture(scope="module")
def rebuilt(ranks, tmp_path_factory):
    source = write_kimi_tokenizer(tmp_path_factory.mktemp("kimi-tokenizer"), ranks)
    out = tmp_path_factory.mktemp("rebuilt")
    assert sorted(copy_tokenizer_files(source, out)) == ["tokenizer.json", "tokenizer_config.json"]
    return out


def test_the_rebuilt_tokenizer_encodes_and_decodes_as_tiktoken(ranks, rebuilt):
    loaded = transformers.AutoTokenizer.from_pretrained(rebuilt)  # no trust_remote_code: no code to run
    assert loaded.is_fast
    encoding = tiktoken_reference(ranks)
    for sample in SAMPLES:
        text = sample.format(reserved=len(ranks) + 100)
        ids = encoding.encode(text, allowed_special="all")
        assert loaded.encode(text) == ids, text
        assert loaded.decode(ids) == encoding.decode(ids) == text
    assert len(loaded) == encoding.n_vocab == len(ranks) + SPECIAL_SLOTS


def test_special_tokens_chat_template_and_settings_survive(ranks, rebuilt):
    loaded = transformers.AutoTokenizer.from_pretrained(rebuilt)
    n = len(ranks)
    assert (loaded.bos_token_id, loaded.pad_token_id, loaded.eos_token_id) == (n, n + 1, n + 2)
    assert loaded.convert_ids_to_tokens(n + 4) == "<|im_assistant|>"
    chat = loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_user|>hi<|im_end|><|im_assistant|>"
    assert loaded.decode(loaded.encode("hi<|im_end|>"), skip_special_tokens=True) == "hi"
    config = json.loads((rebuilt / "tokenizer_config.json").read_text())
    assert "auto_map" not in config and config["model_max_length"] == 4096


def test_the_attnres_tokenizer_loads_a_tiktoken_directory(ranks, tmp_path):
    source = write_kimi_tokenizer(tmp_path / "src", ranks)
    tokenizer = Tokenizer.load(source)
    encoding = tiktoken_reference(ranks)
    assert tokenizer.eos_id == len(ranks) + 2
    assert tokenizer.encode(SAMPLES[2]) == encoding.encode(SAMPLES[2])
    # saved again, it is written as tokenizer.json that reloads the same
    saved = tokenizer.save(tmp_path / "saved")
    assert Tokenizer.load(saved).encode(SAMPLES[1]) == encoding.encode(SAMPLES[1])


def test_the_pattern_is_read_from_the_code_without_running_it(ranks, tmp_path):
    assert pattern_in_code(kimi_code(KIMI_PATTERN_PARTS)) == KIMI_PATTERN
    assert pattern_in_code("pat_str = r'\\w+|\\s+'") == r"\w+|\s+"
    assert pattern_in_code("pat_str = make_pattern()") is None  # computed: nothing is evaluated
    # a checkpoint whose code defines another pattern (cl100k's) gets that one, not Kimi's
    cl100k = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n]*",
              r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+")
    source = write_kimi_tokenizer(tmp_path / "src", ranks, parts=cl100k)
    write_fast_tokenizer(source, tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    encoding = tiktoken_reference(ranks, "|".join(cl100k))
    assert loaded.encode(SAMPLES[2]) == encoding.encode(SAMPLES[2]) != tiktoken_reference(ranks).encode(SAMPLES[2])


def test_without_the_code_kimis_pattern_is_used_with_a_one_line_warning(ranks, tmp_path):
    source = write_kimi_tokenizer(tmp_path / "src", ranks, parts=None)
    with pytest.warns(UserWarning, match="Kimi's published pattern") as caught:
        assert split_pattern(source) == KIMI_PATTERN
    assert "\n" not in str(caught[0].message) and "tokenization*.py" in str(caught[0].message)


@pytest.mark.parametrize("damage, message", [
    ("bad-line", "line 300 is not 'BASE64-TOKEN RANK'"),
    ("rank-gap", "are not 0..555"),
    ("pattern", "does not compile"),
    ("id-in-ranks", "inside tiktoken.model's 556 ranks"),
    ("eos", "eos_token '<|nope|>'"),
    ("no-config", r"tokenizer: \S*tokenizer_config\.json does not exist; copy the checkpoint's original"),
])
def test_what_cannot_be_rebuilt_fails_in_one_line_naming_what_to_do(ranks, tmp_path, damage, message):
    config = {"id-in-ranks": {"added_tokens_decoder": {"7": {"content": "<|x|>"}}},
              "eos": {"eos_token": "<|nope|>"}}.get(damage)
    parts = ("[unclosed",) if damage == "pattern" else KIMI_PATTERN_PARTS
    source = write_kimi_tokenizer(tmp_path / "src", ranks, parts=parts, config=config)
    lines = (source / TIKTOKEN_FILE).read_text().splitlines(keepends=True)
    if damage == "bad-line":
        lines[299] = "not-base64!! 299\n"
    elif damage == "rank-gap":
        lines[-1] = lines[-1].replace(" 555", " 556")
    elif damage == "no-config":
        (source / "tokenizer_config.json").unlink()
    (source / TIKTOKEN_FILE).write_text("".join(lines))
    with pytest.raises(DataError, match=message) as caught:
        check_tiktoken_source(source)
    assert "\n" not in str(caught.value) and ";" in str(caught.value)  # one line: what is wrong; what to do


def test_a_source_with_its_own_tokenizer_json_is_copied_as_it_is(ranks, rebuilt, tmp_path):
    source = write_kimi_tokenizer(tmp_path / "src", ranks)
    (source / "tokenizer.json").write_text((rebuilt / "tokenizer.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is rebuilt, so nothing warns
        check_tiktoken_source(source)
        (tmp_path / "out").mkdir()
        copy_tokenizer_files(source, tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == (source / "tokenizer_config.json").read_text()
