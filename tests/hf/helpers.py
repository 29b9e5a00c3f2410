"""Shared steps of the conversion tests."""

import torch
import transformers

import attnres.hf  # noqa: F401  (registers the Auto classes)
from attnres.cli import main


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
