"""`attnres eval` on a folder that is neither a checkpoint nor a run says so and lists what is inside."""

import pytest

from attnres.checkpoint import CheckpointError
from attnres.cli import main
from attnres.train.evaluate import resolve_checkpoint


def test_a_variant_folder_lists_the_runs_inside_it(tmp_path, capsys):
    variant = tmp_path / "runs" / "block_attnres-N-4"
    for seed in ("seed0", "seed1"):
        (variant / seed / "checkpoints").mkdir(parents=True)
    assert main(["eval", str(variant)]) == 1
    err = capsys.readouterr().err
    assert "is not a checkpoint directory" in err and "state.json is missing" not in err
    assert f"inside it: {variant / 'seed0'}, {variant / 'seed1'}" in err


def test_checkpoints_deeper_down_are_found_and_an_empty_folder_lists_nothing(tmp_path):
    (tmp_path / "a" / "checkpoints" / "step_00000004").mkdir(parents=True)
    (tmp_path / "loose" / "step_00000002").mkdir(parents=True)
    (tmp_path / "loose" / "step_00000002" / "state.json").write_text("{}")
    with pytest.raises(CheckpointError) as error:
        resolve_checkpoint(tmp_path)
    assert f"inside it: {tmp_path / 'a'}, {tmp_path / 'loose' / 'step_00000002'}" in str(error.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a checkpoint directory") as error:
        resolve_checkpoint(tmp_path / "empty")
    assert "inside it" not in str(error.value)


def test_a_broken_checkpoint_is_still_reported_as_broken(tmp_path, capsys):
    checkpoint = tmp_path / "step_00000004"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"")
    assert main(["eval", str(checkpoint)]) == 1
    assert "state.json is missing" in capsys.readouterr().err


@pytest.mark.parametrize("keywords, message", [
    (dict(device="gpu"), r"evaluate_checkpoint: device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (dict(max_batches=0), r"evaluate_checkpoint: max_batches must be None or a positive integer, got 0"),
])
def test_evaluate_checkpoint_checks_its_arguments_before_reading(tmp_path, keywords, message):
    from attnres.common.errors import InputError
    from attnres.train import evaluate_checkpoint

    with pytest.raises(InputError, match=message):
        evaluate_checkpoint(tmp_path / "not-read", **keywords)
