"""A checkpoint is read with its own tokenizer (issue 59, item 2).

Before, `attnres eval` and `analyze` prepared a run's data as its config says, `tokenizer: bpe`: the
data cache keys on the files' sizes and times, so after one training-split file was added they
trained a new BPE and scored the checkpoint on ids that mean other strings (3.700, then 3.961). Now
they tokenise with the tokenizer.json saved in the checkpoint; the token cache keys on that
tokenizer's fingerprint, so the corpus is tokenised again with it and the validation documents,
unchanged, give the same loss.
"""

import json
import random
import shutil

import pytest
import yaml

from attnres.checkpoint import read_checkpoint
from attnres.cli import main
from attnres.data import prepare_data
from attnres.data.split import split_of
from attnres.data.tokenizer import TOKENIZER_FILE, Tokenizer
from attnres.train.evaluate import checkpoint_data_config, checkpoint_tokenizer, load_checkpoint
from attnres.train.run_config import RunConfig
from tests.train.conftest import WORDS, tiny_run

NEW_WORDS = ["zephyr", "quixotic", "juxtapose", "xylograph", "kvetching", "bumfuzzle"]


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """(the run directory, its corpus in tmp_path, which the test may change) of a 4-step run."""
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    for i in range(60):
        (corpus / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(rng.randint(80, 200))))
    run = tiny_run(corpus, tmp_path / "run", steps=4, checkpoint_every=4, eval_every=4, eval_batches=2)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 0
    return tmp_path / "run", corpus


def add_training_document(corpus):
    """A new file in the training split (by the split's hash of its name), of words the corpus lacks."""
    rng = random.Random(0)
    name = next(f"new{i:03d}.txt" for i in range(1000) if split_of(f"new{i:03d}.txt", 0.15, "attnres") == "train")
    text = " ".join(rng.choice(NEW_WORDS + list(WORDS[:10])) for _ in range(3000))
    (corpus / name).write_text(text)


def eval_result(run_dir, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_gives_the_same_loss_after_the_corpus_gained_a_training_file(trained, capsys):
    run_dir, corpus = trained
    before = eval_result(run_dir, capsys)
    add_training_document(corpus)
    after = eval_result(run_dir, capsys)
    assert after["val_loss"] == before["val_loss"] and after["val_tokens"] == before["val_tokens"]

    checkpoint = read_checkpoint(run_dir / "checkpoints" / "step_00000004")
    saved = Tokenizer.load(checkpoint.path)
    # what `eval` used to do, and would still do from the run's config: a BPE trained again, other ids
    retrained = prepare_data(RunConfig.from_dict(checkpoint.run_config).data).tokenizer
    assert retrained.fingerprint != saved.fingerprint
    # what it does now: the checkpoint's tokenizer, the corpus tokenised again with it
    loaded = load_checkpoint(checkpoint.path)
    assert loaded.data.tokenizer.fingerprint == saved.fingerprint
    assert loaded.run.data.tokenizer == "bpe"  # the run's record is as it was


def test_analyze_reads_the_run_with_its_own_tokenizer_and_takes_data(trained, tmp_path, capsys):
    """analyze gives eval's loss after the corpus changed, and --data on a run trained with its own BPE
    (refused before: no pretrained tokenizer) tokenises with the checkpoint's tokenizer."""
    run_dir, corpus = trained
    before = eval_result(run_dir, capsys)
    add_training_document(corpus)
    assert main(["analyze", str(run_dir), "--max-batches", "2", "--out", str(tmp_path / "report")]) == 0
    analysis = json.loads((tmp_path / "report" / "analysis.json").read_text())
    assert json.dumps(analysis).count(repr(before["val_loss"])) >= 1, "eval's loss is not in analysis.json"
    assert main(["analyze", str(run_dir), "--data", str(corpus), "--max-batches", "1", "--seq-len", "16",
                 "--out", str(tmp_path / "data-report")]) == 0


def test_the_tokenizer_is_the_checkpoints_else_its_runs(trained):
    run_dir, _ = trained
    path = run_dir / "checkpoints" / "step_00000004"
    checkpoint = read_checkpoint(path)
    assert checkpoint_tokenizer(path) == path
    assert checkpoint_data_config(checkpoint, RunConfig.from_dict(checkpoint.run_config)).tokenizer == str(path)
    (path / TOKENIZER_FILE).unlink()  # as a distributed checkpoint: no tokenizer beside the weights
    assert checkpoint_tokenizer(path) == run_dir / "tokenizer"
    loose = run_dir.parent / "loose"
    shutil.copytree(path, loose)  # a checkpoint copied out of its run, without a tokenizer: as recorded
    assert checkpoint_tokenizer(loose) is None
    assert checkpoint_data_config(read_checkpoint(loose), RunConfig.from_dict(checkpoint.run_config)).tokenizer == "bpe"
