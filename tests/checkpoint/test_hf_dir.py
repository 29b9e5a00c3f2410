"""Every one-process training checkpoint is a Hugging Face model directory: config.json with the
tokenizer's special-token ids, generation_config.json and the tokenizer itself, so the README's
example (tokenizer, model, generate) runs on a checkpoint directory as it is."""

import json
import os
import stat

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)
from attnres.checkpoint import checkpoint_dirs  # noqa: E402
from attnres.checkpoint.hf_dir import generation_defaults, special_token_ids  # noqa: E402
from attnres.train import RunConfig, train  # noqa: E402
from tests.train.conftest import corpus_dir, tiny_run  # noqa: E402,F401  (corpus_dir: a fixture)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_dir):
    root = tmp_path_factory.mktemp("hf_dir")
    os.environ["ATTNRES_CACHE"] = str(root / "cache")
    previous = os.umask(0o022)
    try:
        result = train(RunConfig.from_dict(tiny_run(corpus_dir, root / "run", steps=4, checkpoint_every=2)))
    finally:
        os.umask(previous)
        del os.environ["ATTNRES_CACHE"]
    return result, checkpoint_dirs(root / "run" / "checkpoints")


def test_every_checkpoint_holds_the_tokenizer_and_its_special_tokens(trained):
    result, checkpoints = trained
    assert len(checkpoints) == 2
    eos = result.data.tokenizer.eos_id
    for checkpoint in checkpoints:
        config = json.loads((checkpoint / "config.json").read_text())
        assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (eos, eos, None)
        generation = json.loads((checkpoint / "generation_config.json").read_text())
        assert generation["eos_token_id"] == eos
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        text = "the king and the river"
        assert tokenizer(text)["input_ids"] == result.data.tokenizer.encode(text)
        assert tokenizer.eos_token_id == eos and tokenizer.pad_token_id == eos


def test_the_readme_example_runs_on_a_checkpoint_directory(trained):
    result, checkpoints = trained
    step_dir = checkpoints[-1]
    tokenizer = transformers.AutoTokenizer.from_pretrained(step_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(step_dir)
    inputs = tokenizer("the king and the river", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    # The reference: argmax decoding step by step with the run's own model, no cache, stopping at EOS.
    ids = inputs["input_ids"]
    result.model.eval()
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, result.model(ids).logits[:, -1:].argmax(-1)], dim=1)
            if ids[0, -1] == result.data.tokenizer.eos_id:
                break
    assert out.tolist() == ids.tolist()
    assert isinstance(tokenizer.decode(out[0]), str)


def test_checkpoint_files_get_the_umask_mode(trained):
    _, checkpoints = trained
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in checkpoints[-1].iterdir()}
    assert "model.safetensors" in modes and "tokenizer.json" in modes
    assert modes == dict.fromkeys(modes, 0o644), modes
    assert stat.S_IMODE(checkpoints[-1].stat().st_mode) == 0o755


def test_generation_defaults_keep_the_sources_fields_and_fill_in_missing_ids():
    ids = special_token_ids({"bos_token_id": 1, "eos_token_id": [2, 7], "other": 3})
    assert ids == {"bos_token_id": 1, "eos_token_id": [2, 7], "pad_token_id": None}
    source = {"eos_token_id": [2, 9], "temperature": 0.6, "pad_token_id": None}
    assert generation_defaults(ids, source) == {"bos_token_id": 1, "eos_token_id": [2, 9], "temperature": 0.6,
                                                "pad_token_id": None}
    assert generation_defaults(ids) == {"bos_token_id": 1, "eos_token_id": [2, 7]}
