"""Shared fixtures: a small local corpus and a tiny run config that trains in seconds."""

import random

import pytest
import yaml

WORDS = ("the of and to in is was that for it with as his on be at by had are but from not they which you one "
         "were all we when there can an your more said what so if about out them some time would like him into "
         "has two see could first water been made people over did down only way find long day get come new "
         "light earth land house king city river bread stone field night morning word voice hand sea").split()


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A folder of 120 short .txt documents of word-salad English (deterministic)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(120):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."
                     for _ in range(rng.randint(8, 16))]
        (root / f"doc{i:03d}.txt").write_text(" ".join(sentences))
    return root


def tiny_run(corpus_dir, out_dir, **train_overrides) -> dict:
    """A run dict (model, data, train, out_dir) for a 2-layer model on `corpus_dir`."""
    train = dict(steps=12, batch_size=4, seq_len=32, lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_every=4,
                 eval_batches=2, log_every=1, checkpoint_every=4, keep_checkpoints=3, tensorboard=False,
                 progress=False, precision="fp32")
    train.update(train_overrides)
    return {"out_dir": str(out_dir),
            "model": dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                          residual="delta_block", num_blocks=2, max_seq_len=64),
            "data": dict(source=str(corpus_dir), tokenizer="bpe", vocab_size=300, val_fraction=0.15),
            "train": train}


@pytest.fixture
def write_config(tmp_path, corpus_dir, monkeypatch):
    """Write a tiny run config to YAML; returns (path, run dict). Caches go to a per-test folder."""
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))

    def write(name="run", **train_overrides):
        run = tiny_run(corpus_dir, tmp_path / name, **train_overrides)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(run))
        return path, run

    return write
