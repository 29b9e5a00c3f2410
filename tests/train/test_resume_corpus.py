"""A resume reads the corpus it trained on with the tokenizer it trained with (issue 59, item 3).

A run stopped after its checkpoint is resumed: with the corpus as it was, it tokenises with the run's saved
tokenizer and finishes; with a file of the corpus edited, added or removed since, it is refused, naming the
changed split, before anything of the run is rewritten."""

import shutil
from pathlib import Path

import pytest

from attnres.train import CheckpointError, RunConfig, Trainer
from attnres.train import trainer as trainer_module
from tests.train.conftest import tiny_run

STEPS, STOP = 6, 3


class Interrupted(Exception):
    pass


@pytest.fixture
def stopped_run(corpus_dir, tmp_path, monkeypatch):
    """(run dict, its corpus folder) of a tiny run stopped after its checkpoint at step STOP, on a copy of the corpus."""
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    corpus = shutil.copytree(corpus_dir, tmp_path / "corpus")
    run = tiny_run(corpus, tmp_path / "run", steps=STEPS, checkpoint_every=STOP, eval_every=STEPS)

    def stop(record):
        if record["step"] == STOP:
            raise Interrupted

    with pytest.raises(Interrupted):
        Trainer(RunConfig.from_dict(run), on_step=stop).fit()
    return run, corpus


def test_a_resume_tokenises_with_the_tokenizer_saved_with_its_checkpoint(stopped_run, monkeypatch):
    run, _ = stopped_run
    seen = []
    real = trainer_module.prepare_data
    monkeypatch.setattr(trainer_module, "prepare_data", lambda config: seen.append(config) or real(config))
    result = Trainer(RunConfig.from_dict(run), resume=True).fit()
    assert len(result.step_times) == STEPS - STOP
    assert Path(seen[0].tokenizer).name == f"step_{STOP:08d}"  # the checkpoint's tokenizer.json, not a BPE trained again
    assert RunConfig.from_dict(run).data.tokenizer == "bpe"  # the run's record keeps its own setting


@pytest.mark.parametrize("edit", ["added", "edited", "removed"])
def test_a_resume_on_a_changed_corpus_is_refused_naming_the_split(stopped_run, edit):
    run, corpus = stopped_run
    documents = sorted(corpus.iterdir())
    if edit == "added":
        (corpus / "zz_new.txt").write_text("A new document with words the old tokenizer never saw: zyxwv. " * 20)
    elif edit == "edited":
        for path in documents:  # every file, so the training split changes whichever split a file falls in
            path.write_text(path.read_text() + " Appended.")
    else:
        for path in documents[:30]:
            path.unlink()
    tokenizer_dir = Path(run["out_dir"]) / "tokenizer"
    before = {p.name: p.read_bytes() for p in tokenizer_dir.iterdir()}
    with pytest.raises(CheckpointError, match=r"the corpus changed since .*step_00000003 was saved: the tokens of the "
                                              r"train.*differ .*init_from"):
        Trainer(RunConfig.from_dict(run), resume=True).fit()
    assert {p.name: p.read_bytes() for p in tokenizer_dir.iterdir()} == before  # refused before anything was rewritten
