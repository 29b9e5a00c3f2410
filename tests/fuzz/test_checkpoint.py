"""Fuzzing the checkpoint readers: state.json with missing, extra and mistyped keys (and not JSON at
all), read by `read_checkpoint` / `latest_checkpoint` and then restored into a model, its optimizer and
scheduler; the tensors' own files stay as written, so only state.json is under test here
(tests/fuzz/test_safetensors.py fuzzes the tensor files)."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnres.checkpoint import CheckpointError, latest_checkpoint, read_checkpoint
from attnres.checkpoint.format import Checkpoint, checkpoint_path
from attnres.checkpoint.single import restore_model, restore_training, save_checkpoint
from attnres.common.errors import InputError
from tests.fuzz.helpers import check_reader, json_garbage, json_keys, json_text, json_values, mutated, unchanged

ERRORS = (CheckpointError, InputError)
FILE_NAMES = ("model.safetensors", "trainer.safetensors", "state.json", "../model.safetensors", "/etc/hostname", ".",
              "", "missing.bin", "a/b")


def _training_objects():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(checkpoint directory, its state.json) of a one-process checkpoint of a tiny model after one step."""
    model, optimizer, scheduler = _training_objects()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    extra = {"data": {"epoch": 0, "position": 3}, "stability": {"steps": 1, "loss_spikes": 0, "grad_spikes": 0,
                                                                 "clipped_steps": 0, "losses": [2.5], "grad_norms": [1.0]}}
    root = tmp_path_factory.mktemp("checkpoints")
    path = save_checkpoint(root, 1, model, optimizer, scheduler, {"model": {"hidden_size": 4}}, extra, keep=1)
    return path, json.loads((path / "state.json").read_text())


def _file_entries():
    digest = st.fixed_dictionaries({"bytes": st.one_of(st.integers(), json_values),
                                    "sha256": st.one_of(st.text(max_size=64), json_values)})
    return st.dictionaries(st.sampled_from(FILE_NAMES), st.one_of(digest, json_values), max_size=3)


def _state_documents(state):
    as_json = st.one_of(mutated(state, json_values, json_keys),
                        mutated(state, json_values, json_keys).flatmap(
                            lambda s: _file_entries().map(lambda files: {**s, "files": files})),
                        json_values).map(json_text)
    return st.one_of(as_json, as_json.map(str.encode), json_garbage)


def _restore(checkpoint: Checkpoint):
    """What resuming does with a checkpoint read_checkpoint accepted."""
    assert isinstance(checkpoint.step, int) and isinstance(checkpoint.run_config, dict)
    assert isinstance(checkpoint.is_dcp, bool)
    model, optimizer, scheduler = _training_objects()
    if checkpoint.is_dcp:
        return checkpoint
    restore_model(checkpoint, model)
    restore_training(checkpoint, optimizer, scheduler)
    return checkpoint


@given(data=st.data())
def test_read_checkpoint_state(saved, data):
    original, state = saved
    document = data.draw(_state_documents(state))
    verify = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_path(Path(tmp) / "checkpoints", 1)
        shutil.copytree(original, path)
        state_file = path / "state.json"
        state_file.unlink()
        if isinstance(document, bytes):
            state_file.write_bytes(document)
        else:
            state_file.write_text(document, encoding="utf-8")
        with unchanged(Path(tmp)):
            check_reader(lambda: _restore(read_checkpoint(path, verify=verify)), ERRORS)
            result = check_reader(lambda: latest_checkpoint(path.parent), ERRORS)
        assert isinstance(result, (Checkpoint, *ERRORS))


@given(st.sampled_from(["state.json", "model.safetensors", "trainer.safetensors", None]), st.booleans())
def test_read_checkpoint_layout(saved, missing, as_directory):
    """A checkpoint directory without one of its files, or with a directory where a file should be."""
    original, _ = saved
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / original.name
        shutil.copytree(original, path)
        if missing is not None:
            (path / missing).unlink()
            if as_directory:
                (path / missing).mkdir()
        with unchanged(Path(tmp)):
            result = check_reader(lambda: _restore(read_checkpoint(path)), ERRORS)
        assert isinstance(result, (Checkpoint, *ERRORS))
        assert missing is None or isinstance(result, CheckpointError)


def test_saved_checkpoint_restores(saved):
    """The unmutated checkpoint restores: the fuzz tests above start from an input the readers accept."""
    path, _ = saved
    assert isinstance(_restore(read_checkpoint(path)), Checkpoint)


@given(st.sampled_from(["model", "data", "train"]), st.one_of(st.none(), st.lists(json_values, max_size=2),
                                                               st.text(max_size=5), st.integers()))
def test_a_run_config_section_that_is_not_an_object_is_refused_by_name(saved, section, value):
    """A null or wrong-typed section of state.json's run_config (not only a wrong value in one)."""
    original, state = saved
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_path(Path(tmp) / "checkpoints", 1)
        shutil.copytree(original, path)
        (path / "state.json").write_text(json_text({**state, "run_config": {**state["run_config"], section: value}}))
        result = check_reader(lambda: read_checkpoint(path, verify=False), ERRORS)
    assert isinstance(result, CheckpointError) and f"state.json's run_config.{section} must be a JSON object" in str(result)
