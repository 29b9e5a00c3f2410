"""A resume uses exactly what it records (issue 59, item 1): every setting that differs from the checkpoint's is
either applied from the next step, with one line on stderr naming the old and new value, or refused by name.

Each case interrupts a tiny run after its checkpoint at step 4 of 8, resumes it with one setting changed and
checks the optimizer's parameter groups (lr, initial_lr, weight_decay, betas), the scheduler's base rates and
rates, the lr of every logged step after the resume and the last checkpoint against the run's record
(config.yaml, and the run config in state.json)."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnres.checkpoint import checkpoint_dirs
from attnres.cli import main
from attnres.train import CheckpointError, RunConfig, Trainer, load_run_config
from attnres.train.metrics import read_metrics
from attnres.train.schedule import lr_factor
from tests.train.conftest import tiny_run

STEPS, STOP = 8, 4  # the run's steps; where it was interrupted (just after its checkpoint)

# (key, values) of the settings a resume applies; their values are valid with the base run's lr 3e-3 and min_lr 3e-4
APPLIED = {
    "train.lr": [1e-3, 0.05], "train.min_lr": [0.0, 1e-3], "train.warmup_steps": [0, 6],
    "train.schedule": ["wsd", "constant"], "train.decay_fraction": [0.5], "train.weight_decay": [0.0, 0.3],
    "train.beta1": [0.5], "train.beta2": [0.999], "train.routing_lr_mult": [10.0], "train.grad_clip": [None, 0.5],
    "train.steps": [6, 12], "train.eval_every": [2], "train.precision": ["bf16"],
}
# (key, value) of settings a resume refuses: the model, the data, the batch order, what acts only at step 0
REFUSED = {
    "model.intermediate_size": 48, "data.vocab_size": 280, "train.seq_len": 16, "train.batch_size": 2,
    "train.grad_accum": 2, "train.seed": 1, "train.query_init": "normal",
}


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def interrupted_run(corpus_dir, tmp_path_factory):
    """(run dict, run directory) of a tiny run stopped after its checkpoint at step STOP of STEPS."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(cache))
        run = tiny_run(corpus_dir, tmp_path_factory.mktemp("base") / "run", steps=STEPS, checkpoint_every=STOP,
                       eval_every=STEPS)

        def stop(record):
            if record["step"] == STOP:
                raise Interrupted

        with pytest.raises(Interrupted):
            Trainer(RunConfig.from_dict(run), on_step=stop).fit()
    return run, cache


@pytest.fixture
def fresh_copy(interrupted_run, tmp_path, monkeypatch):
    """A function giving (run dict, out_dir) of a new copy of the interrupted run, for one resume."""
    run, cache = interrupted_run
    monkeypatch.setenv("ATTNRES_CACHE", str(cache))

    def copy():
        out = Path(shutil.copytree(run["out_dir"], tmp_path / "run"))
        return {**run, "out_dir": str(out)}, out

    return copy


def setting(run: dict, key: str):
    """The value of `key` ("train.lr") in `run`, defaults filled in."""
    section, _, name = key.partition(".")
    return RunConfig.from_dict(run).to_dict()[section][name]


def with_setting(run: dict, key: str, value) -> dict:
    section, _, name = key.partition(".")
    return {**run, section: {**run[section], name: value}}


def base_rates(train) -> list[float]:
    """Each parameter group's base rate under `train` (decay, no_decay, routing: build_optimizer's order)."""
    return [train.lr, train.lr, train.lr * train.routing_lr_mult]


def check_uses_the_record(trainer: Trainer, out: Path, step: int) -> None:
    """The optimizer's groups and the scheduler at `step` hold what config.yaml records."""
    record = load_run_config(out / "config.yaml")
    assert record == trainer.run
    train = record.train
    groups = trainer.optimizer.param_groups
    assert [g["name"] for g in groups] == ["decay", "no_decay", "routing"]
    assert [g["initial_lr"] for g in groups] == base_rates(train)
    assert trainer.scheduler.base_lrs == base_rates(train)
    expected = [base * lr_factor(step, train) for base in base_rates(train)]
    assert [g["lr"] for g in groups] == pytest.approx(expected, rel=1e-12)
    assert trainer.scheduler.get_last_lr() == [g["lr"] for g in groups]
    assert trainer.scheduler.last_epoch == step
    assert [g["weight_decay"] for g in groups] == [train.weight_decay, 0.0, 0.0]
    assert all(tuple(g["betas"]) == (train.beta1, train.beta2) for g in groups)


def resume_and_check(run: dict, out: Path) -> Trainer:
    """Resume `run` from its checkpoint at STOP, check it before and after training, return the trainer."""
    trainer = Trainer(RunConfig.from_dict(run), resume=True)
    try:
        check_uses_the_record(trainer, out, STOP)
    except BaseException:
        trainer._release()
        raise
    trainer.fit()
    train = trainer.cfg
    check_uses_the_record(trainer, out, train.steps)
    logged = {r["step"]: r["lr"] for r in read_metrics(out) if "lr" in r and r["step"] > STOP}
    assert sorted(logged) == list(range(STOP + 1, train.steps + 1))
    for step, lr in logged.items():  # the rate each step trained at: this config's schedule from its base rate
        assert lr == pytest.approx(train.lr * lr_factor(step - 1, train), rel=1e-12), step
    last = checkpoint_dirs(out / "checkpoints")[-1]
    state = json.loads((last / "state.json").read_text())
    assert state["step"] == train.steps and state["run_config"] == trainer.run.to_dict()
    groups = state["optimizer"]["param_groups"]
    assert [g["initial_lr"] for g in groups] == base_rates(train)
    assert [g["weight_decay"] for g in groups] == [train.weight_decay, 0.0, 0.0]
    assert all(g["betas"] == [train.beta1, train.beta2] for g in groups)
    return trainer


@pytest.mark.parametrize("key, value", [(key, value) for key, values in APPLIED.items() for value in values])
def test_a_changed_setting_is_applied_from_the_next_step_and_named(fresh_copy, capsys, key, value):
    run, out = fresh_copy()
    capsys.readouterr()
    resume_and_check(with_setting(run, key, value), out)
    old = setting(run, key)
    notes = [line for line in capsys.readouterr().err.splitlines() if "changed on resume" in line]
    assert notes == [f"{key} changed on resume: checkpoint {old!r}, now {value!r}; applied from step {STOP + 1}"]


def test_an_unchanged_resume_notes_nothing_and_keeps_the_schedule(fresh_copy, capsys):
    run, out = fresh_copy()
    capsys.readouterr()
    resume_and_check(run, out)
    assert "changed on resume" not in capsys.readouterr().err


def test_the_issue_repro_a_higher_lr_follows_the_new_schedule_and_never_falls_below_min_lr(fresh_copy):
    """`--resume --set train.steps=... --set train.lr=0.05` once ran at the old base rate x the new shape."""
    run, out = fresh_copy()
    run = with_setting(with_setting(run, "train.lr", 0.05), "train.steps", 12)
    resume_and_check(run, out)
    rates = [r["lr"] for r in read_metrics(out) if r["step"] > STOP]
    assert min(rates) >= run["train"]["min_lr"] and rates[0] > 0.04


@pytest.mark.parametrize("key, value", REFUSED.items())
def test_a_changed_setting_that_fixes_the_run_is_refused_by_name(fresh_copy, key, value):
    run, out = fresh_copy()
    before = (out / "config.yaml").read_bytes()
    old = setting(run, key)
    with pytest.raises(CheckpointError, match=rf"does not match this config: {key}: checkpoint {old!r}, config "
                                              rf"{value!r}; resume with the checkpoint's values or train into "
                                              rf"another out_dir$"):
        Trainer(RunConfig.from_dict(with_setting(run, key, value)), resume=True)
    assert (out / "config.yaml").read_bytes() == before  # nothing rewritten


def test_the_cli_prints_one_line_per_applied_setting_on_stderr(fresh_copy, capsys):
    run, out = fresh_copy()
    path = out.parent / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    capsys.readouterr()
    assert main(["train", "--config", str(path), "--resume", "--set", "train.lr=0.01",
                 "--set", "train.weight_decay=0.0"]) == 0
    err = capsys.readouterr().err
    assert f"train.lr changed on resume: checkpoint 0.003, now 0.01; applied from step {STOP + 1}" in err
    assert f"train.weight_decay changed on resume: checkpoint 0.1, now 0.0; applied from step {STOP + 1}" in err
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["lr"] == 0.01


@st.composite
def one_change(draw):
    """One setting and a new value for it, applied or refused."""
    key = draw(st.sampled_from(sorted(APPLIED) + sorted(REFUSED)))
    if key in REFUSED:
        return key, REFUSED[key]
    if key == "train.lr":
        return key, draw(st.floats(min_value=3e-4, max_value=0.1))
    if key == "train.weight_decay":
        return key, draw(st.floats(min_value=0.0, max_value=1.0))
    if key in ("train.beta1", "train.beta2"):
        return key, draw(st.floats(min_value=0.0, max_value=0.999))
    if key == "train.min_lr":
        return key, draw(st.floats(min_value=0.0, max_value=3e-3))
    if key == "train.warmup_steps":
        return key, draw(st.integers(min_value=0, max_value=10))
    if key == "train.steps":
        return key, draw(st.integers(min_value=STOP + 1, max_value=10))
    return key, draw(st.sampled_from(APPLIED[key]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(change=one_change())
def test_property_one_random_change_is_applied_as_recorded_or_refused(interrupted_run, monkeypatch, change):
    base, cache = interrupted_run
    monkeypatch.setenv("ATTNRES_CACHE", str(cache))
    key, value = change
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        shutil.copytree(base["out_dir"], out)
        run = with_setting({**base, "out_dir": str(out)}, key, value)
        if key in REFUSED:
            with pytest.raises(CheckpointError, match=rf"does not match this config: {key}: "):
                Trainer(RunConfig.from_dict(run), resume=True)
        else:
            resume_and_check(run, out)
