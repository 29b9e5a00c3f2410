"""`attnres analyze --data`: a converted model (`attnres convert` output, step 0) and its fine-tuned
checkpoint, measured on the same held-out documents, with the causal check."""

import json

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from attnres.cli import main  # noqa: E402
from attnres.hf import AttnResForCausalLM  # noqa: E402
from tests.hf.helpers import tiny_source_and_corpus  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny Qwen3 with its BPE tokenizer, converted to Block AttnRes, and a 3-step fine-tuning run of it."""
    root = tmp_path_factory.mktemp("analyze-converted")
    source, tokenizer, corpus = tiny_source_and_corpus(root)
    source.save_pretrained(root / "source")
    tokenizer.save(root / "source")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(root / "cache"))
        assert main(["convert", str(root / "source"), "--residual", "block_attnres", "--option", "num_blocks=2",
                     "--out", str(root / "conv")]) == 0
        run = root / "run.yaml"
        run.write_text(yaml.safe_dump({"out_dir": str(root / "ft"), "data": {"source": str(corpus)},
                                       "train": {"steps": 3, "batch_size": 2, "seq_len": 32, "eval_every": 3,
                                                 "eval_batches": 1, "checkpoint_every": 3, "tensorboard": False,
                                                 "progress": False, "precision": "fp32", "warmup_steps": 1}}))
        assert main(["finetune", str(root / "conv"), "--config", str(run)]) == 0
    return root, corpus


def test_a_converted_model_and_its_fine_tuned_run_on_the_same_held_out_text(converted, tmp_path, monkeypatch):
    root, corpus = converted
    monkeypatch.setenv("ATTNRES_CACHE", str(root / "cache"))
    out = tmp_path / "report"
    assert main(["analyze", str(root / "conv"), str(root / "ft"), "--data", str(corpus), "--seq-len", "32",
                 "--batch-size", "2", "--max-batches", "2", "--causal", "--labels", "converted", "fine-tuned",
                 "--out", str(out)]) == 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["settings"]["data"] == str(corpus)
    step0, tuned = analysis["checkpoints"]
    assert (step0["step"], tuned["step"]) == (0, 3)
    assert step0["num_tokens"] == tuned["num_tokens"] == 2 * 2 * 32  # the same batches for both
    # step 0 is the converted model itself: its loss on those batches, computed independently here
    model = AttnResForCausalLM.from_pretrained(root / "conv").eval()
    from attnres.data import DataConfig, eval_batches, prepare_data
    data = prepare_data(DataConfig(source=str(corpus), tokenizer=str(root / "conv")))
    batches = eval_batches(data.val_tokens, 32, 2, 2)
    with torch.no_grad():
        losses = [model(b, labels=b).loss.item() for b in batches]
    assert step0["val_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    for entry in (step0, tuned):
        assert entry["causal"]["clean_loss"] == pytest.approx(entry["val_loss"], rel=1e-5)
        assert len(entry["causal"]["routers"]) == len(entry["depth_stats"]["source_names"])
    # zero queries at step 0: every multi-source router weighs its sources uniformly
    for names, weights in zip(step0["depth_stats"]["source_names"], step0["depth_stats"]["mean_weights"]):
        assert weights == pytest.approx([1 / len(names)] * len(names), abs=1e-6)
    summary = (out / "summary.md").read_text()
    assert "| converted | zero |" in summary and "| fine-tuned | mean |" in summary


def test_a_converted_model_needs_data_and_a_bpe_run_refuses_it(converted, tmp_path, monkeypatch, capsys):
    root, corpus = converted
    monkeypatch.setenv("ATTNRES_CACHE", str(root / "cache"))
    assert main(["analyze", str(root / "conv"), "--out", str(tmp_path / "r")]) == 1
    assert "give --data SOURCE" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
