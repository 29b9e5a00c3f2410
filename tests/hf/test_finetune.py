"""`attnres finetune`: a converted model continues from its source's function, with the Delta recipe."""

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from attnres.cli import main  # noqa: E402
from attnres.train.metrics import read_metrics  # noqa: E402
from tests.hf.helpers import tiny_source_and_corpus  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny transformers Qwen3 with a BPE tokenizer of its vocabulary size, and a text corpus."""
    root = tmp_path_factory.mktemp("finetune")
    source, tokenizer, corpus = tiny_source_and_corpus(root)
    with torch.no_grad():  # realistic activation scales (method §4: RMSNorm eps)
        for p in source.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    source.save_pretrained(root / "source")
    tokenizer.save(root / "source")
    return root, corpus


def finetune(root, corpus, conversion, name, *sets):
    out = root / f"conv-{name}"
    if not out.exists():
        assert main(["convert", str(root / "source"), *conversion, "--out", str(out)]) == 0
    cfg = root / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": str(root / f"run-{name}"), "data": {"source": str(corpus), "val_fraction": 0.2},
                                   "train": {"steps": 3, "batch_size": 2, "seq_len": 32, "eval_every": 3, "eval_batches": 1,
                                             "checkpoint_every": 3, "log_every": 1, "tensorboard": False,
                                             "progress": False, "precision": "fp32", "warmup_steps": 1}}))
    assert main(["finetune", str(out), "--config", str(cfg), *sets]) == 0
    return [r["loss"] for r in read_metrics(root / f"run-{name}")]


def test_exact_conversion_has_no_loss_spike_and_random_queries_do(setup, monkeypatch):
    root, corpus = setup
    monkeypatch.setenv("ATTNRES_CACHE", str(root / "cache"))
    standard = finetune(root, corpus, ["--residual", "standard"], "standard")
    gate = finetune(root, corpus, ["--residual", "delta_block", "--option", "num_blocks=2",
                                   "--option", "exact_conversion=gate"], "gate")
    block = finetune(root, corpus, ["--residual", "block_attnres", "--option", "num_blocks=2"], "block")
    noisy = finetune(root, corpus, ["--residual", "block_attnres", "--option", "num_blocks=2"], "block-normal",
                     "--set", "train.query_init=normal")
    assert gate[0] == pytest.approx(standard[0], abs=1e-5)   # step 1: the source model's loss exactly
    assert block[0] == pytest.approx(standard[0], abs=1e-4)  # zero queries: the same function
    assert abs(noisy[0] - standard[0]) > 10 * abs(block[0] - standard[0])
    run = yaml.safe_load((root / "run-gate" / "config.yaml").read_text())
    assert run["train"]["lr"] == 5e-5 and run["train"]["routing_lr_mult"] == 100.0
    assert run["model"]["residual"] == "delta_block" and run["model"]["vocab_size"] == 300
    assert run["data"]["tokenizer"] == str(root / "conv-gate")


def test_finetune_without_a_tokenizer_is_refused(setup, tmp_path, capsys):
    root, _ = setup
    bare = tmp_path / "bare"
    assert main(["convert", str(root / "source"), "--out", str(bare)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink(missing_ok=True)
    assert main(["finetune", str(bare), "--set", "train.seq_len=32"]) == 2
    assert "needs the model's own tokenizer" in capsys.readouterr().err
    from attnres.train import RunConfigError
    from attnres.train.run_config import load_finetune_config

    with pytest.raises(RunConfigError, match=r"needs the model's own tokenizer and \S*bare has none"):
        load_finetune_config(bare, overrides=["train.seq_len=32"])  # the library refuses it too, for Python users
    run = load_finetune_config(bare, overrides=["train.seq_len=32", "data.tokenizer=" + str(root / "source")])
    assert run.train.lr == 5e-5 and run.data.tokenizer == str(root / "source")  # the recipe, refined


def test_finetune_checkpoints_keep_the_sources_generation_defaults_and_chat_template(setup, tmp_path, monkeypatch):
    import json
    import shutil

    root, corpus = setup
    monkeypatch.setenv("ATTNRES_CACHE", str(root / "cache"))
    source = tmp_path / "source"
    shutil.copytree(root / "source", source)
    (source / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    generation = {"eos_token_id": [0, 7], "temperature": 0.7, "do_sample": True}
    (source / "generation_config.json").write_text(json.dumps(generation))
    assert main(["convert", str(source), "--out", str(tmp_path / "converted")]) == 0
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "run"), "data": {"source": str(corpus), "val_fraction": 0.2},
                                   "train": {"steps": 1, "batch_size": 2, "seq_len": 32, "eval_every": 1,
                                             "eval_batches": 1, "checkpoint_every": 1, "tensorboard": False,
                                             "progress": False, "precision": "fp32", "warmup_steps": 1}}))
    assert main(["finetune", str(tmp_path / "converted"), "--config", str(cfg)]) == 0
    step_dir = tmp_path / "run" / "checkpoints" / "step_00000001"
    saved = json.loads((step_dir / "generation_config.json").read_text())
    assert {k: saved[k] for k in generation} == generation
    assert (step_dir / "chat_template.jinja").read_text() == (source / "chat_template.jinja").read_text()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(step_dir)
    assert loaded.generation_config.eos_token_id == [0, 7]


def test_a_set_on_a_nested_model_field_keeps_the_rest_of_the_pretrained_section(setup, tmp_path):
    """--set model.residual_options.key_norm=false refines the converted model's options field by
    field: its exact_conversion and num_blocks stay (the whole section was replaced before)."""
    from attnres.train.run_config import load_finetune_config

    root, _ = setup
    out = tmp_path / "conv"
    assert main(["convert", str(root / "source"), "--residual", "delta_block", "--option", "num_blocks=2",
                 "--option", "exact_conversion=gate", "--out", str(out)]) == 0
    model = load_finetune_config(out, overrides=["model.residual_options.key_norm=false",
                                                 "train.seq_len=32"]).model
    options = model.residual_options
    assert options.key_norm is False and options.exact_conversion == "gate" and options.num_blocks == 2
