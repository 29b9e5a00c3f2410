"""`attnres compare` reuses finished runs, resumes interrupted ones, and splits work into shards."""

import json

import pytest
import torch
import yaml

import attnres.compare.run_comparison as compare_run
from attnres.compare.presets import load_preset, variant_run
from attnres.compare.run_comparison import RECORD_FILE, run_compare
from attnres.report.variant_names import variant_name
from attnres.train import RunConfigError

TINY = {
    "description": "two variants x two seeds, a few steps",
    "seeds": 2,
    "cost": {"repeats": 5, "warmup": 0},
    "variants": [{"residual": "standard"}, {"residual": "block_attnres", "num_blocks": 2, "query_init": "normal"}],
    "run": {"model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                      "intermediate_size": 32, "max_seq_len": 32},
            "data": {"source": "demo", "tokenizer": "bpe", "vocab_size": 300, "max_documents": 40,
                     "val_fraction": 0.1},
            "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "warmup_steps": 1, "eval_every": 2,
                      "eval_batches": 1, "checkpoint_every": 2, "keep_checkpoints": 1, "tensorboard": False,
                      "progress": False, "precision": "fp32"}},
}


@pytest.fixture
def preset(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return load_preset(str(path))


def count_training(monkeypatch) -> list[str]:
    trained = []
    real_train = compare_run.train

    def counting_train(run, resume=False, **kwargs):
        trained.append((run.out_dir, resume))
        return real_train(run, resume=resume, **kwargs)

    monkeypatch.setattr(compare_run, "train", counting_train)
    return trained


def count_cost_measurements(monkeypatch) -> list[list[str]]:
    measured = []
    real_measure = compare_run.measure_costs

    def counting_measure(runs, *args, **kwargs):
        measured.append(list(runs))
        return real_measure(runs, *args, **kwargs)

    monkeypatch.setattr(compare_run, "measure_costs", counting_measure)
    return measured


def test_query_init_variant_sets_train_field_and_name(preset):
    assert preset.variants[1]["query_init"] == "normal"
    run = variant_run(preset.run, preset.variants[1], seed=3, out_dir="x")
    assert run.train.query_init == "normal" and run.train.seed == 3 and run.model.residual == "block_attnres"
    assert variant_name(preset.variants[1]) == "block_attnres (N=2) [q~N(0,0.02)]"
    with pytest.raises(RunConfigError, match=r"unknown key.*'lr'.*allowed: residual, residual_options, query_init "
                                             r"and the options of residual='standard'"):
        variant_run(preset.run, {"residual": "standard", "lr": 1.0}, seed=0, out_dir="x")


def test_a_variant_sets_router_ablations_as_model_fields_and_a_bad_one_is_refused_before_training(preset):
    variant = {"residual": "full_attnres", "router_query": "input_dependent", "router_key_norm": False}
    run = variant_run(preset.run, variant, seed=0, out_dir="x")
    options = run.model.residual_options.to_dict()
    assert options["query"] == "input_dependent" and options["key_norm"] is False
    assert variant_name(variant) == "full_attnres [input query] [no key norm]"
    nested = {"residual": "full_attnres", "residual_options": {"query": "input_dependent", "key_norm": False}}
    assert variant_run(preset.run, nested, seed=0, out_dir="x") == run and variant_name(nested) == variant_name(variant)
    with pytest.raises(Exception, match=r"router_weights applies only to residual in \[.*'full_attnres'.*\]; "
                                        r"leave it unset for residual='standard'"):
        variant_run(preset.run, {"residual": "standard", "router_weights": "sigmoid"}, seed=0, out_dir="x")


def test_shards_split_the_runs_and_a_last_call_reuses_them(preset, tmp_path, monkeypatch):
    trained, measured = count_training(monkeypatch), count_cost_measurements(monkeypatch)
    out = tmp_path / "cmp"
    assert run_compare(preset, out, shard=(0, 2), log=lambda *_: None) is None
    assert run_compare(preset, out, shard=(1, 2), log=lambda *_: None) is None
    assert not (out / "results.json").exists() and measured == []  # shards write no report, measure no cost
    names = sorted(run_dir.split("/cmp/runs/")[1] for run_dir, _ in trained)
    assert names == ["block_attnres-N-2-q-N-0-0-02/seed0", "block_attnres-N-2-q-N-0-0-02/seed1",
                     "standard/seed0", "standard/seed1"]
    # seed-major order (standard 0, block 0, standard 1, block 1): shard 0 took positions 0 and 2
    assert [r.split("/cmp/runs/")[1] for r, _ in trained[:2]] == ["standard/seed0", "standard/seed1"]
    trained.clear()
    # a record written before a config field existed still matches (the field takes its default)
    record_path = out / "runs" / "standard" / "seed0" / RECORD_FILE
    saved = json.loads(record_path.read_text())
    del saved["run"]["train"]["query_init"]
    record_path.write_text(json.dumps(saved))
    results = run_compare(preset, out, log=lambda *_: None)
    assert trained == []  # everything was reused
    records = {v["name"]: [r["final_val_loss"] for r in v["runs"]] for v in results["variants"]}
    saved = json.loads((out / "runs" / "standard" / "seed1" / RECORD_FILE).read_text())
    assert records["standard"][1] == saved["record"]["final_val_loss"]
    # each record says where it ran: the floating-point path its losses came from
    assert saved["record"]["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (out / "report.md").is_file() and len(results["variants"][1]["runs"]) == 2
    # the cost is measured by the call that writes the report, every variant in that one process,
    # and again by the next such call: it is never carried over from an earlier process
    assert measured == [["standard", "block_attnres (N=2) [q~N(0,0.02)]"]]
    run_compare(preset, out, log=lambda *_: None)
    assert trained == [] and len(measured) == 2
    assert len(results["cost"]["variants"]["standard"]["train_step_s"]["samples_s"]) == 5


def test_an_interrupted_run_resumes_and_other_settings_are_refused(preset, tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    run_compare(preset, out, seeds=1, log=lambda *_: None)
    run_dir = out / "runs" / "standard" / "seed0"
    (run_dir / RECORD_FILE).unlink()  # as if stopped after the last checkpoint, before the record
    trained = count_training(monkeypatch)
    results = run_compare(preset, out, seeds=1, log=lambda *_: None)
    assert trained == [(str(run_dir), True)]
    assert results["variants"][0]["runs"][0]["step_time_s"] > 0  # from the logged steps
    changed = load_preset(str(tmp_path / "tiny.yaml"), ["train.lr=0.01"])
    with pytest.raises(RunConfigError, match="holds a run with other settings"):
        run_compare(changed, out, seeds=1, log=lambda *_: None)


def test_bad_shard_is_an_error(preset, tmp_path):
    with pytest.raises(ValueError, match="shard must be"):
        run_compare(preset, tmp_path, shard=(2, 2))
