"""The data-parallel runs that test_data_parallel, test_checkpoint and test_env check.

Everything that needs two processes runs in ONE 2-rank spawn per test session (a process start
costs seconds), after the single-process reference runs it is compared with. Each test then reads
the run directories (metrics.jsonl, checkpoints) and the files the ranks wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.distributed.spawn import run_workers
from tests.distributed.workers import clear_outputs, run_jobs
from tests.train.conftest import tiny_run

# Relative tolerances of data-parallel against single-process runs, also stated in
# docs/how-to/scale-out.md. fp32: only the order of float additions differs (a mean of per-rank means,
# gradient all-reduce); observed about 1e-7 over 10 AdamW steps. bf16: rounding differs too.
FP32_RTOL = 1e-5
BF16_RTOL = 1e-3
# Kimi Linear (KIMI below): the same, but its delta attention's chunked triangular solves and the experts'
# per-expert products round differently with the batch split; observed up to 1.6e-5 at step 8 of 10 under DDP.
KIMI_RTOL = 1e-4
WORLD = 2
STEPS = 10
SAVE_EVERY = 5

# Kimi Linear's options (tests/model/test_kimi_decoder.py): delta and latent attention alternating, experts from
# layer 1 on, so every stage boundary has a mixture-of-experts layer on each side.
KIMI = dict(moe={"num_experts": 4, "experts_per_token": 2, "expert_size": 16, "shared_experts": 1, "dense_layers": 1,
                 "scoring": "sigmoid", "score_bias": True},
            mla={"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16},
            kda={"num_heads": 2, "head_dim": 8},
            layer_types=["linear_attention", "latent_attention", "linear_attention", "latent_attention"])
MODELS = {
    "standard": dict(residual="standard", num_blocks=None),
    "routed": dict(residual="block_attnres", num_blocks=2),  # a replacement variant with a final router
    "gated": dict(residual="delta_block", num_blocks=2, exact_conversion="gate"),  # scalar (0-dim) gates
    "kimi": dict(residual="block_attnres", num_blocks=2, num_layers=4, **KIMI),  # experts, latent and delta attention
}
TRAIN = {
    "standard": dict(grad_accum=2),  # accumulation: DDP's no_sync and FSDP's per-micro-step reduce
    "routed": dict(diagnostics_every=SAVE_EVERY),
    "gated": dict(),
    "kimi": dict(grad_accum=2),  # expert loads counted over micro-steps and summed over ranks
    "bf16": dict(diagnostics_every=SAVE_EVERY, precision="bf16", activation_checkpointing=True),
}


@dataclass
class Runs:
    """Where everything is: `root / name` is a run directory; `cache` the data cache to point at."""

    root: Path
    cache: Path
    corpus: Path

    def config(self, name: str, kind: str, **train) -> dict:
        """The run dict of run `name` for the setting `kind` (a TRAIN key)."""
        return make_run(self.corpus, self.root / name, kind, **train)

    def dir(self, name: str) -> Path:
        return self.root / name


def make_run(corpus: Path, out: Path, kind: str, **train) -> dict:
    model = MODELS["routed" if kind == "bf16" else kind]
    settings = dict(steps=STEPS, checkpoint_every=SAVE_EVERY, eval_every=SAVE_EVERY, **TRAIN[kind])
    run = tiny_run(corpus, out, **{**settings, **train})
    run["model"].update(model)
    return run


_SHARED: Runs | None = None


def shared_runs(tmp_path_factory, corpus_dir) -> Runs:
    """Train the reference and the 2-rank runs once per session and return where they are."""
    global _SHARED
    if _SHARED is None:
        root = tmp_path_factory.mktemp("data_parallel")
        runs = Runs(root, root / "cache", Path(corpus_dir))
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ATTNRES_CACHE", str(runs.cache))  # inherited by the spawned ranks
            _train_all(runs)
        _SHARED = runs
    return _SHARED


def _train_all(runs: Runs) -> None:
    from attnres.train import RunConfig, train

    for kind in TRAIN:  # one process: the references
        train(RunConfig.from_dict(runs.config(f"ref_{kind}", kind)))
    jobs = [{"kind": "env", "out": str(runs.root / "env")}, {"kind": "sharded", "out": str(runs.root / "sharded")}]
    # Single-process checkpoints cut back to step 5, for 2-rank resumes (copied by a job, so that a
    # retried spawn starts from them again).
    jobs += [{"kind": "copy", "src": str(runs.dir(f"ref_{kind}")), "dst": str(runs.dir(dst)), "keep_step": SAVE_EVERY}
             for kind, dst in (("routed", "from1_fsdp"), ("standard", "from1_ddp"))]
    for kind, mode in [("standard", "ddp"), ("standard", "fsdp"), ("routed", "ddp"), ("routed", "fsdp"),
                       ("gated", "fsdp"), ("bf16", "fsdp"), ("kimi", "ddp"), ("kimi", "fsdp")]:
        jobs.append({"kind": "train", "run": runs.config(f"{mode}_{kind}", kind, parallel=mode)})
    jobs += [
        {"kind": "train", "resume": True, "run": runs.config("from1_fsdp", "routed", parallel="fsdp")},
        {"kind": "train", "resume": True, "run": runs.config("from1_ddp", "standard", parallel="ddp")},
        # FSDP's checkpoint resumed under DDP: same world size, other sharding
        {"kind": "copy", "src": str(runs.dir("fsdp_routed")), "dst": str(runs.dir("fsdp_to_ddp")),
         "keep_step": SAVE_EVERY},
        {"kind": "train", "resume": True, "run": runs.config("fsdp_to_ddp", "routed", parallel="ddp")},
        {"kind": "copy", "src": str(runs.dir("fsdp_routed")), "dst": str(runs.dir("corrupt")),
         "keep_step": STEPS, "corrupt": "__1_0.distcp"},
        {"kind": "error", "resume": True, "run": runs.config("corrupt", "routed", parallel="fsdp"),
         "out": str(runs.root / "corrupt_error")},
        {"kind": "error", "run": runs.config("bad_batch", "routed", parallel="ddp", batch_size=3),
         "out": str(runs.root / "batch_error")},
    ]
    run_workers(run_jobs, WORLD, jobs, reset=lambda: clear_outputs(jobs))


def losses(run_dir: Path, key: str = "loss") -> list[tuple[int, float]]:
    """[(step, value)] of metric `key` in a run's metrics.jsonl, where present."""
    from attnres.train.metrics import read_metrics

    return [(r["step"], r[key]) for r in read_metrics(run_dir) if key in r]


def assert_close(actual: list, expected: list, rtol: float) -> None:
    """Same steps; values (numbers or lists of numbers) equal within rtol; message names the step."""
    assert [s for s, _ in actual] == [s for s, _ in expected], (actual, expected)
    for (step, a), (_, b) in zip(actual, expected):
        a_list, b_list = (a, b) if isinstance(a, list) else ([a], [b])
        for x, y in zip(a_list, b_list, strict=True):
            if x is None or y is None:  # e.g. the max weight of a router with one source
                assert x is None and y is None, f"step {step}: {x} vs {y}"
                continue
            assert math.isclose(x, y, rel_tol=rtol, abs_tol=rtol * 1e-3), f"step {step}: {x} vs {y} (rtol {rtol})"
