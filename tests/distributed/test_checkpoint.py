"""Distributed (DCP) checkpoints: layout, resume across world sizes and sharding, corruption, safety."""

import json
import pickle

import pytest

from attnres.cli import main
from attnres.train import CheckpointError, RunConfig, read_checkpoint, train
from attnres.checkpoint import DCP_FORMAT, checkpoint_dirs
from tests.distributed.dp_runs import FP32_RTOL, SAVE_EVERY, STEPS, assert_close, losses, make_run, shared_runs
from tests.distributed.workers import copy_run
from tests.train.conftest import corpus_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir):  # noqa: F811
    return shared_runs(tmp_path_factory, corpus_dir)


def model_of(runs, checkpoint, **changes):
    """A fresh model of the checkpoint's run (the vocabulary is its tokenizer's), with `changes`."""
    from attnres.data.tokenizer import Tokenizer
    from attnres.model import AttnResLM

    vocab = Tokenizer.load(runs.dir("fsdp_routed") / "tokenizer").vocab_size
    config = RunConfig.from_dict({**checkpoint.run_config, "model": {**checkpoint.run_config["model"], **changes}})
    return AttnResLM(config.model.with_vocab_size(vocab))


@pytest.fixture
def cache(runs, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(runs.cache))
    return runs.cache


def test_layout_of_a_distributed_checkpoint(runs):
    root = runs.dir("fsdp_routed") / "checkpoints"
    assert [p.name for p in checkpoint_dirs(root)] == ["step_00000005", "step_00000010"]
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    path = checkpoint_dirs(root)[-1]
    assert sorted(p.name for p in path.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.json"]
    state = json.loads((path / "state.json").read_text())
    assert state["format"] == DCP_FORMAT and state["world_size"] == 2 and state["parallel"] == "fsdp"
    assert sorted(state["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # all verified on load
    assert state["extra"]["data"] == {"epoch": 0, "position": STEPS * 4}  # global: world-size independent
    assert read_checkpoint(path).is_dcp


@pytest.mark.parametrize("resumed, uninterrupted", [
    ("from1_fsdp", "ref_routed"),     # single-process safetensors -> FSDP on 2 ranks
    ("from1_ddp", "ref_standard"),    # single-process safetensors -> DDP on 2 ranks
    ("fsdp_to_ddp", "fsdp_routed"),   # FSDP's DCP -> DDP, same world size
])
def test_resumed_runs_match_uninterrupted_ones(runs, resumed, uninterrupted):
    steps = [s for s, _ in losses(runs.dir(resumed))]
    assert steps == list(range(1, STEPS + 1))  # 1-5 kept from before, 6-10 trained after the resume
    for key in ("loss", "grad_norm", "val_loss"):
        assert_close(losses(runs.dir(resumed), key), losses(runs.dir(uninterrupted), key), FP32_RTOL)
    assert len(checkpoint_dirs(runs.dir(resumed) / "checkpoints")) == 2


@pytest.mark.parametrize("source, kind", [("fsdp_routed", "routed"), ("ddp_standard", "standard")])
def test_world_2_checkpoint_resumes_in_one_process(runs, cache, tmp_path, source, kind):
    run_dir = tmp_path / "resumed"
    copy_run(runs.dir(source), run_dir, SAVE_EVERY)
    train(RunConfig.from_dict(make_run(runs.corpus, run_dir, kind)), resume=True)
    for key in ("loss", "grad_norm", "val_loss"):
        assert_close(losses(run_dir, key), losses(runs.dir(source), key), FP32_RTOL)
        assert_close(losses(run_dir, key), losses(runs.dir(f"ref_{kind}"), key), FP32_RTOL)
    # the one-process continuation writes the one-process format
    assert not read_checkpoint(checkpoint_dirs(run_dir / "checkpoints")[-1]).is_dcp


def test_eval_reads_a_distributed_checkpoint(runs, cache, capsys):
    assert main(["eval", str(runs.dir("fsdp_routed"))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == STEPS
    assert report["val_loss"] == pytest.approx(losses(runs.dir("fsdp_routed"), "val_loss")[-1][1], rel=FP32_RTOL)


def test_corrupt_checkpoint_is_refused_on_every_rank(runs):
    """Each rank hashes part of the files; the mismatch one rank finds is raised on all of them."""
    for rank in range(2):
        message = (runs.root / f"corrupt_error.{rank}").read_text()
        assert message.startswith("CheckpointError: checkpoint ")
        assert "is corrupt: __1_0.distcp does not match its recorded size and sha256" in message


@pytest.mark.parametrize("name, pattern", [
    ("__0_0.distcp", "is corrupt: __0_0.distcp does not match"),
    (".metadata", "is corrupt: .metadata does not match"),
])
def test_corrupt_file_is_refused_in_one_process(runs, cache, tmp_path, name, pattern):
    run_dir = tmp_path / "corrupt"
    copy_run(runs.dir("fsdp_routed"), run_dir, STEPS, corrupt=name)
    path = checkpoint_dirs(run_dir / "checkpoints")[-1]
    with pytest.raises(CheckpointError, match=pattern):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=pattern):
        train(RunConfig.from_dict(make_run(runs.corpus, run_dir, "routed", steps=12)), resume=True)


def test_missing_file_is_refused(runs, tmp_path):
    run_dir = tmp_path / "missing"
    copy_run(runs.dir("fsdp_routed"), run_dir, STEPS)
    path = checkpoint_dirs(run_dir / "checkpoints")[-1]
    (path / "__1_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="is incomplete: __1_0.distcp is missing"):
        read_checkpoint(path)


def test_checkpoint_of_another_model_is_refused(runs):
    from attnres.distributed.checkpoint import load_model_state

    checkpoint = read_checkpoint(checkpoint_dirs(runs.dir("fsdp_routed") / "checkpoints")[-1])
    with pytest.raises(CheckpointError, match=r"does not fit this model: embed_tokens.weight: checkpoint "
                                              r"\(\d+, 32\), model \(\d+, 48\)"):
        load_model_state(checkpoint, model_of(runs, checkpoint, hidden_size=48))
    with pytest.raises(CheckpointError, match=r"missing \[\], unexpected \['residual.routers.0.key_norm.weight'"):
        load_model_state(checkpoint, model_of(runs, checkpoint, residual="standard", residual_options={}))


class Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("touch EXPLOITED",))


def test_metadata_with_foreign_globals_is_refused_not_executed(runs, tmp_path, monkeypatch):
    """.metadata is a pickle; only DCP's metadata classes may appear in it."""
    from attnres.distributed.checkpoint import load_model_state

    run_dir = tmp_path / "crafted"
    copy_run(runs.dir("fsdp_routed"), run_dir, STEPS)
    path = checkpoint_dirs(run_dir / "checkpoints")[-1]
    (path / ".metadata").write_bytes(pickle.dumps(Exploit()))
    monkeypatch.chdir(tmp_path)
    checkpoint = read_checkpoint(path, verify=False)  # as if the digests had been forged too
    model = model_of(runs, checkpoint)
    with pytest.raises(CheckpointError, match=r"\.metadata does not read as DCP metadata \(posix.system is not "
                                              r"part of DCP metadata\)"):
        load_model_state(checkpoint, model)
    assert not (tmp_path / "EXPLOITED").exists()
