"""`attnres convert` end to end: a transformers checkpoint in, an attnres checkpoint out, same logits."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.cli import main  # noqa: E402
from tests.hf.helpers import assert_converts_to_source_logits  # noqa: E402


@pytest.fixture
def qwen3_dir(tmp_path):
    config = transformers.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, tie_word_embeddings=True,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # realistic activation scales (see method §4 on RMSNorm eps)
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(tmp_path / "src")
    (tmp_path / "src" / "tokenizer_config.json").write_text('{"eos_token": "x"}')
    return tmp_path / "src", model


@pytest.mark.parametrize("args", [["--residual", "standard"],
                                  ["--residual", "block_attnres", "--option", "num_blocks=2"],
                                  ["--residual", "delta_block", "--option", "num_blocks=2",
                                   "--option", "exact_conversion=gate"]])
def test_convert_then_from_pretrained_reproduces_the_source(tmp_path, qwen3_dir, args, capsys):
    source, hf_model = qwen3_dir
    loaded = assert_converts_to_source_logits(source, hf_model, args, tmp_path / "out", vocab_size=80)
    assert loaded.config.residual == args[1]


def test_convert_refusal_is_a_clear_error(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "missing" in capsys.readouterr().err
