"""`attnres compare` and `attnres scaling` never resume an interrupted run whose settings differ from the new
invocation's (issue 59, item 1): they refuse before anything trains, in one line naming each setting and the
way out; with the same settings the run resumes."""

import pytest
import yaml

import attnres.compare.run_comparison as compare_run
import attnres.scaling.sweep as sweep
from attnres.compare.presets import load_preset
from attnres.compare.run_comparison import RECORD_FILE, run_compare
from attnres.scaling.preset import load_preset as load_scaling_preset
from attnres.scaling.sweep import run_sweep
from attnres.train import RunConfigError

RUN = {"model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32,
                 "max_seq_len": 32},
       "data": {"source": "demo", "tokenizer": "bpe", "vocab_size": 300, "max_documents": 40, "val_fraction": 0.1},
       "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "warmup_steps": 1, "eval_every": 2, "eval_batches": 1,
                 "checkpoint_every": 2, "keep_checkpoints": 1, "tensorboard": False, "progress": False,
                 "precision": "fp32"}}
COMPARE = {"description": "one variant, one seed, a few steps", "seeds": 1, "cost": {"repeats": 5, "warmup": 0},
           "variants": [{"residual": "standard"}], "run": RUN}
SCALING = {"description": "two sizes, one variant", "variants": [{"residual": "standard"}],
           "sizes": [{"hidden_size": 16, "num_layers": 2}, {"hidden_size": 24, "num_layers": 2}],
           "rules": {"head_dim": 8, "kv_groups": 2, "ffn_ratio": 2, "ffn_multiple": 8, "tokens_per_parameter": 0.1,
                     "evaluations": 1},
           "run": {"model": {"max_seq_len": 16}, "data": RUN["data"],
                   "train": {"batch_size": 2, "seq_len": 16, "eval_batches": 1, "tensorboard": False,
                             "progress": False, "precision": "fp32"}}}
CHANGES = [("train.lr", 0.05, r"train\.lr: 0\.0006 there, 0\.05 now"),
           ("train.steps", 6, r"train\.steps: 4 there, 6 now"),
           ("model.intermediate_size", 48, r"model\.intermediate_size: 32 there, 48 now")]


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def cache(data_cache, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(data_cache))


def interrupt_first_run(monkeypatch, module) -> list[bool]:
    """Make `module.train` stop its first run right after its first checkpoint; returns each call's resume."""
    calls = []
    real_train = module.train

    def train(run, resume=False, on_step=None, **kwargs):
        calls.append(resume)
        if len(calls) == 1:
            def step(record):
                if record["step"] == run.train.checkpoint_every:
                    raise KeyboardInterrupt
            return real_train(run, resume=resume, on_step=step, **kwargs)
        return real_train(run, resume=resume, on_step=on_step, **kwargs)

    monkeypatch.setattr(module, "train", train)
    return calls


def interrupted_compare(tmp_path, monkeypatch):
    """(preset path, --out, each train call's resume) of COMPARE stopped after its first run's first checkpoint."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(COMPARE))
    out = tmp_path / "cmp"
    calls = interrupt_first_run(monkeypatch, compare_run)
    with pytest.raises(KeyboardInterrupt):
        run_compare(load_preset(str(path)), out, log=lambda *_: None)
    return path, out, calls


@pytest.mark.parametrize("key, value, named", CHANGES, ids=[key for key, _, _ in CHANGES])
def test_compare_refuses_to_resume_an_interrupted_run_of_other_settings(tmp_path, monkeypatch, key, value, named):
    path, out, calls = interrupted_compare(tmp_path, monkeypatch)
    run_dir = out / "runs" / "standard" / "seed0"
    config = (run_dir / "config.yaml").read_bytes()
    with pytest.raises(RunConfigError) as refused:
        run_compare(load_preset(str(path), [f"{key}={value}"]), out, log=lambda *_: None)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{run_dir} holds an interrupted run with other settings (")
    assert pytest.importorskip("re").search(named, message), message
    assert message.endswith("choose another --out, or pass --force to discard that run and train it again with these "
                            "settings")
    assert calls == [False] and (run_dir / "config.yaml").read_bytes() == config  # nothing trained or rewritten
    results = run_compare(load_preset(str(path)), out, log=lambda *_: None)  # the same settings: it resumes
    assert calls == [False, True] and (run_dir / RECORD_FILE).is_file()
    assert results["variants"][0]["runs"][0]["final_val_loss"] > 0


def test_scaling_refuses_to_resume_an_interrupted_run_of_other_settings(tmp_path, monkeypatch):
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(SCALING))
    out = tmp_path / "sweep"
    calls = interrupt_first_run(monkeypatch, sweep)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_scaling_preset(str(path)), out, shard=(0, 2), log=lambda *_: None)
    # the preset derives min_lr from lr: both are named
    with pytest.raises(RunConfigError, match=r"holds an interrupted run with other settings \(train\.lr: 0\.0006 "
                                             r"there, 0\.05 now; train\.min_lr: \S+ there, \S+ now\); choose "
                                             r"another --out, or pass --force to discard that run"):
        run_sweep(load_scaling_preset(str(path), ["train.lr=0.05"]), out, shard=(0, 2), log=lambda *_: None)
    assert calls == [False]
    assert run_sweep(load_scaling_preset(str(path)), out, shard=(0, 2), log=lambda *_: None) is None
    assert calls[:2] == [False, True]  # the same settings: it resumes


def test_compare_with_force_discards_the_interrupted_run_of_other_settings_and_trains_it_again(tmp_path, monkeypatch):
    path, out, calls = interrupted_compare(tmp_path, monkeypatch)
    lines = []
    results = run_compare(load_preset(str(path), ["train.lr=0.05"]), out, log=lines.append, force=True)
    assert calls == [False, False]  # trained from step 0, not resumed under the new settings
    assert any("discarding an interrupted run with other settings (train.lr: 0.0006 there, 0.05 now" in line
               for line in lines), lines
    record = yaml.safe_load((out / "runs" / "standard" / "seed0" / RECORD_FILE).read_text())
    assert record["run"]["train"]["lr"] == 0.05 and results["variants"][0]["runs"][0]["final_val_loss"] > 0
