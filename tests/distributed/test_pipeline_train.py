"""`attnres train` with train.parallel=pipeline on 2 gloo ranks: the same losses as one process,
byte counters in metrics.jsonl, checkpoints that resume across pipeline / one process / DDP, and
clear errors for what the pipeline does not support.

Everything that needs two processes runs in ONE 2-rank spawn (a process start costs seconds),
after the single-process reference runs it is compared with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnres.train.train_config import resolve_parallel
from attnres.distributed.env import DistributedEnv
from attnres.train import RunConfig, TrainConfig, TrainConfigError, load_run_config, read_checkpoint, train
from attnres.checkpoint import DCP_FORMAT, checkpoint_dirs
from tests.distributed.dp_runs import FP32_RTOL, KIMI, KIMI_RTOL, assert_close, losses
from tests.distributed.spawn import run_workers
from tests.distributed.workers import clear_outputs, copy_run, run_jobs
from tests.train.conftest import corpus_dir, tiny_run  # noqa: F401  (fixture)

# fp32 tolerance against one process, also stated in docs/explanation/pipeline.md: the pipeline runs the same
# operations on micro-batches (a mean of micro-batch means, gradients summed over micro-batches and
# the tied embedding's two halves added across ranks), so only the order of float additions
# differs, as with DDP.
STEPS, SAVE_EVERY = 8, 4
BATCH, SEQ_LEN, HIDDEN = 4, 32, 32
MODELS = {
    "standard": dict(residual="standard", num_blocks=None),
    "routed": dict(residual="block_attnres", num_blocks=4),  # a block per layer: every stage boundary aligned
    "kimi": dict(residual="block_attnres", num_blocks=4, **KIMI),
}
SCHEDULES = {
    "gpipe": dict(schedule="gpipe", num_microbatches=2),  # 2 stages of 2 layers, micro-batches of 2 rows
    # 4 stages of 1 layer, rank r runs stages r and r + 2, micro-batches of 1 row; sources cached
    "interleaved": dict(schedule="interleaved1f1b", stages_per_rank=2, num_microbatches=4),
}


def make_run(corpus: Path, out: Path, model: str, schedule: str | None = None, **train) -> dict:
    """A 4-layer tiny run; with `schedule` (a SCHEDULES key) trained as a pipeline."""
    settings = dict(steps=STEPS, checkpoint_every=SAVE_EVERY, eval_every=SAVE_EVERY, batch_size=BATCH,
                    seq_len=SEQ_LEN, diagnostics_every=SAVE_EVERY if model == "routed" else None)
    if schedule is not None:
        settings.update(parallel="pipeline", pipeline=SCHEDULES[schedule])
    run = tiny_run(corpus, out, **{**settings, **train})
    run["model"].update(num_layers=4, hidden_size=HIDDEN, **MODELS[model])
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir):  # noqa: F811
    """Train the references in this process, then every 2-rank job in one spawn; returns the root."""
    root = tmp_path_factory.mktemp("pipeline_train")
    corpus = Path(corpus_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNRES_CACHE", str(root / "cache"))  # inherited by the spawned ranks
        for model in MODELS:
            train(RunConfig.from_dict(make_run(corpus, root / f"ref_{model}", model)))
        bad_layout = make_run(corpus, root / "bad_layout", "routed", "interleaved", steps=1)
        bad_layout["model"]["num_blocks"] = 2  # blocks of 2 layers: a 4-stage split cuts them
        jobs = [{"kind": "train", "run": make_run(corpus, root / f"{schedule}_{model}", model, schedule,
                                                  activation_checkpointing=schedule == "interleaved")}
                for schedule in SCHEDULES for model in MODELS]
        jobs += [
            # a single-process checkpoint resumed under the pipeline (copied by a job: a retried spawn
            # starts from it again)
            {"kind": "copy", "src": str(root / "ref_routed"), "dst": str(root / "from1_pipe"), "keep_step": SAVE_EVERY},
            {"kind": "train", "resume": True, "run": make_run(corpus, root / "from1_pipe", "routed", "interleaved")},
            # a pipeline checkpoint resumed under DDP
            {"kind": "copy", "src": str(root / "interleaved_routed"), "dst": str(root / "pipe_to_ddp"),
             "keep_step": SAVE_EVERY},
            {"kind": "train", "resume": True, "run": make_run(corpus, root / "pipe_to_ddp", "routed", parallel="ddp")},
            # a pipeline checkpoint resumed by a pipeline of another shape (4 stages -> 2)
            {"kind": "copy", "src": str(root / "interleaved_routed"), "dst": str(root / "pipe_to_gpipe"),
             "keep_step": SAVE_EVERY},
            {"kind": "train", "resume": True, "run": make_run(corpus, root / "pipe_to_gpipe", "routed", "gpipe")},
            {"kind": "error", "out": str(root / "layout_error"), "run": bad_layout},
        ]
        run_workers(run_jobs, 2, jobs, reset=lambda: clear_outputs(jobs))
    return root


@pytest.fixture
def cache(runs, monkeypatch):
    monkeypatch.setenv("ATTNRES_CACHE", str(runs / "cache"))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("model", list(MODELS))
def test_pipeline_losses_match_one_process(runs, schedule, model):
    """Losses, gradient norms (global, tied embedding counted once, clipping active) and validation
    losses of every step within FP32_RTOL of the single-process run."""
    run_dir = runs / f"{schedule}_{model}"
    assert [s for s, _ in losses(run_dir)] == list(range(1, STEPS + 1))  # rank 0 alone, once per step
    # Kimi: the expert loads are summed over ranks, so each step's imbalance and bias update are one process's.
    for key in ("loss", "grad_norm", "val_loss") + (("moe/imbalance",) if model == "kimi" else ()):
        assert_close(losses(run_dir, key), losses(runs / f"ref_{model}", key), KIMI_RTOL if model == "kimi" else FP32_RTOL)
    assert losses(run_dir, "grad_norm")[0][1] > 1.0  # train.grad_clip=1: the global norm was clipped


def test_routing_diagnostics_match_one_process(runs):
    """Diagnostics run on every rank's whole model after the parameters are synchronised."""
    for key in ("diag/hidden_rms", "diag/grad_rms", "diag/max_weight", "diag/entropy"):
        expected = losses(runs / "ref_routed", key)
        assert expected, key
        assert_close(losses(runs / "interleaved_routed", key), expected, FP32_RTOL)


def test_pipeline_bytes_are_logged_every_step(runs):
    tensor = (BATCH // 2) * SEQ_LEN * HIDDEN * 4  # one fp32 (micro-batch rows, T, D) tensor of GPipe
    for record in [json.loads(line) for line in (runs / "gpipe_standard" / "metrics.jsonl").read_text().splitlines()]:
        # 2 micro-batches x one transition carrying the stream; one gradient back per tensor sent
        assert (record["pipe/fwd_bytes"], record["pipe/bwd_bytes"], record["pipe/saved_bytes"]) == \
            (2 * tensor, 2 * tensor, 0)
    routed = [json.loads(line) for line in (runs / "interleaved_routed" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["pipe/saved_bytes"] > 0 and r["pipe/fwd_bytes"] == r["pipe/bwd_bytes"] for r in routed)
    assert "pipe/fwd_bytes" not in json.loads((runs / "ref_routed" / "metrics.jsonl").read_text().splitlines()[0])


def test_pipeline_checkpoint_is_distributed_with_every_parameter_named_once(runs):
    path = checkpoint_dirs(runs / "interleaved_routed" / "checkpoints")[-1]
    state = read_checkpoint(path).state
    assert state["format"] == DCP_FORMAT and state["parallel"] == "pipeline" and state["world_size"] == 2
    names = [name for group in state["optimizer"]["param_groups"] for name in group["params"]]
    model_names = {key.removeprefix("model.") for key in _dcp_keys(path) if key.startswith("model.")}
    assert len(names) == len(set(names)) and set(names) == model_names - {"lm_head.weight"}  # tied: one name
    optim_names = {key.removeprefix("optim.").rsplit(".", 1)[0] for key in _dcp_keys(path) if key.startswith("optim.")}
    assert optim_names == set(names)  # the two ranks' disjoint optimizer states, together complete


@pytest.mark.parametrize("resumed, uninterrupted", [
    ("from1_pipe", "ref_routed"),               # single-process safetensors -> pipeline
    ("pipe_to_ddp", "interleaved_routed"),      # pipeline DCP -> DDP
    ("pipe_to_gpipe", "interleaved_routed"),    # pipeline DCP -> another pipeline split
])
def test_resumed_runs_match_uninterrupted_ones(runs, resumed, uninterrupted):
    assert [s for s, _ in losses(runs / resumed)] == list(range(1, STEPS + 1))
    for key in ("loss", "grad_norm", "val_loss"):
        assert_close(losses(runs / resumed, key), losses(runs / uninterrupted, key), FP32_RTOL)


def test_pipeline_checkpoint_resumes_in_one_process(runs, cache, corpus_dir, tmp_path):  # noqa: F811
    run_dir = tmp_path / "resumed"
    copy_run(runs / "interleaved_routed", run_dir, SAVE_EVERY)
    train(RunConfig.from_dict(make_run(Path(corpus_dir), run_dir, "routed")), resume=True)
    for key in ("loss", "grad_norm", "val_loss"):
        assert_close(losses(run_dir, key), losses(runs / "interleaved_routed", key), FP32_RTOL)
    assert not read_checkpoint(checkpoint_dirs(run_dir / "checkpoints")[-1]).is_dcp  # one process, its format


def test_stage_split_inside_a_block_is_refused_on_every_rank(runs):
    for rank in range(2):
        message = (runs / f"layout_error.{rank}").read_text()
        assert message.startswith("TrainConfigError: train.pipeline.layers_per_stage=(1, 1, 1, 1) puts stage "
                                  "boundaries at layers [1, 3], inside a block of 4 sub-layers")
        assert "or set train.pipeline.allow_partial_blocks=True" in message


@pytest.mark.parametrize("settings, pattern", [
    (dict(parallel="pipeline"), r"TrainConfig.precision='bf16' is not supported with parallel='pipeline'.*"
                                r"set train.precision=fp32"),
    (dict(parallel="pipeline", precision="fp32", grad_accum=2), r"TrainConfig.grad_accum=2 is not supported with "
                                                                r"parallel='pipeline'"),
    (dict(parallel="pipeline", precision="fp32", compile=True), r"TrainConfig.compile=true is not supported"),
    (dict(parallel="pipeline", precision="fp32", batch_size=6), r"TrainConfig.batch_size=6 must be divisible by "
                                                                r"TrainConfig.pipeline.num_microbatches=4"),
    (dict(pipeline={"schedule": "zb"}), r"TrainConfig.pipeline.schedule must be one of \['gpipe', '1f1b', "
                                        r"'interleaved1f1b'\], got 'zb'"),
    (dict(pipeline={"schedule": "gpipe", "stages_per_rank": 2}), r"TrainConfig.pipeline.stages_per_rank must be 1 "
                                                                 r"for schedule='gpipe'"),
    (dict(pipeline={"num_microbatches": 0}), r"TrainConfig.pipeline.num_microbatches must be a positive integer"),
    (dict(pipeline={"cache": "yes"}), r"TrainConfig.pipeline.cache must be True or False"),
    (dict(pipeline={"microbatches": 2}), r"unknown train.pipeline key\(s\) \['microbatches'\]; allowed: "
                                         r"\['allow_partial_blocks', 'cache', 'layers_per_stage', 'num_microbatches'"),
    (dict(pipeline="gpipe"), r"TrainConfig.pipeline must be a mapping"),
    (dict(parallel="pp"), r"TrainConfig.parallel must be one of \['auto', 'none', 'ddp', 'fsdp', 'pipeline'\], "
                          r"got 'pp'$"),
])
def test_pipeline_settings_are_validated_at_construction(settings, pattern):
    with pytest.raises(TrainConfigError, match=pattern):
        TrainConfig(**settings)


@pytest.mark.parametrize("env, pattern", [
    (None, r"train.parallel='pipeline' needs a process group: launch with `torchrun"),
    (DistributedEnv(0, 1, 0, torch.device("cpu")), r"train.parallel='pipeline' needs at least 2 processes"),
])
def test_pipeline_needs_two_processes(env, pattern):
    with pytest.raises(TrainConfigError, match=pattern):
        resolve_parallel(TrainConfig(parallel="pipeline", precision="fp32"), env)


def test_pipeline_fields_from_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  hidden_size: 32\n  num_layers: 4\n  num_heads: 2\n  num_kv_heads: 1\n"
                    "  intermediate_size: 64\ntrain:\n  precision: fp32\n  pipeline:\n    num_microbatches: 8\n")
    run = load_run_config(path, ["train.parallel=pipeline", "train.pipeline.schedule=interleaved1f1b",
                                 "train.pipeline.stages_per_rank=2", "train.pipeline.layers_per_stage=[1, 1, 1, 1]"])
    assert run.train.parallel == "pipeline"
    assert (run.train.pipeline.schedule, run.train.pipeline.stages_per_rank, run.train.pipeline.num_microbatches,
            run.train.pipeline.layers_per_stage) == ("interleaved1f1b", 2, 8, (1, 1, 1, 1))
    assert RunConfig.from_dict(run.to_dict()) == run  # written to config.yaml and state.json, read back
    assert TrainConfig().pipeline.schedule == "1f1b"  # every run has the section; only parallel=pipeline uses it


def _dcp_keys(path: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
