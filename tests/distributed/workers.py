"""Bodies that spawned ranks run (module-level, so `spawn` can import them in the child processes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def run_jobs(rank: int, world_size: int, jobs: list[dict]) -> None:
    """Run `jobs` in order on every rank. Kinds:
    train   {"run": run dict, "resume": bool}
    error   {"run", "resume", "out": file}: training must raise; rank r writes "<type>: <message>" to out.r
    copy    {"src", "dst", "keep_step", "corrupt": file or None}: rank 0 copies a run directory, drops
            checkpoints after keep_step, optionally flips a byte in the latest checkpoint's `corrupt`
    env     {"out": file}: process-group helpers; rank r writes its observations to out.r as JSON
    sharded {"out": file}: a tied model under FSDP; rank r writes what its parameters look like to out.r
    """
    from attnres.distributed.env import barrier
    from attnres.train import RunConfig, train

    for job in jobs:
        if job["kind"] == "train":
            train(RunConfig.from_dict(job["run"]), resume=job.get("resume", False))
        elif job["kind"] == "error":
            try:
                train(RunConfig.from_dict(job["run"]), resume=job.get("resume", False))
            except Exception as error:  # noqa: BLE001  (the parent test checks type and message)
                Path(f"{job['out']}.{rank}").write_text(f"{type(error).__name__}: {error}")
            else:
                raise AssertionError(f"expected training to fail: {job}")
        elif job["kind"] == "copy":
            if rank == 0:
                copy_run(Path(job["src"]), Path(job["dst"]), job["keep_step"], job.get("corrupt"))
            barrier()
        elif job["kind"] == "env":
            _env_checks(rank, world_size, job["out"])
        elif job["kind"] == "sharded":
            _sharded_checks(rank, job["out"])
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")


def clear_outputs(jobs: list[dict]) -> None:
    """Remove everything `jobs` write (run folders, copies, per-rank files), so that they can run again
    from the start: the `reset` of a retried spawn (tests/distributed/spawn.py). What they only read
    (reference runs, the data cache) is kept."""
    for job in jobs:
        targets = []
        if "run" in job:
            targets.append(Path(job["run"]["out_dir"]))
        if job["kind"] == "copy":
            targets.append(Path(job["dst"]))
        if "out" in job:
            out = Path(job["out"])
            targets += out.parent.glob(f"{out.name}.*")
        for target in targets:
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()


def copy_run(src: Path, dst: Path, keep_step: int, corrupt: str | None = None) -> None:
    """Copy run directory `src` to `dst` as if it had stopped after checkpoint `keep_step`; with
    `corrupt`, flip one byte of that file in the kept checkpoint."""
    from attnres.checkpoint import checkpoint_dirs

    shutil.copytree(src, dst)
    for path in checkpoint_dirs(dst / "checkpoints"):
        if int(path.name.split("_")[1]) > keep_step:
            shutil.rmtree(path)
    if corrupt is not None:
        target = checkpoint_dirs(dst / "checkpoints")[-1] / corrupt
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))


def _env_checks(rank: int, world_size: int, out: str) -> None:
    from attnres.distributed.env import all_gather_objects, all_reduce_mean, current_env, is_main, main_first

    env = current_env()

    def first():
        return rank

    def fails():
        raise ValueError("rank 0 could not prepare")

    try:
        main_first(fails)
        propagated = None
    except Exception as error:  # noqa: BLE001
        propagated = f"{type(error).__name__}: {error}"
    Path(f"{out}.{rank}").write_text(json.dumps({
        "rank": env.rank, "world_size": env.world_size, "is_main": is_main(),
        "mean": all_reduce_mean(float(rank + 1)), "gathered": all_gather_objects(rank * 10),
        "main_first": main_first(first), "propagated": propagated}))


def _sharded_checks(rank: int, out: str) -> None:
    from torch.distributed.tensor import DTensor

    from attnres.distributed.wrap import wrap_model
    from attnres.distributed.env import current_env
    from attnres.model import AttnResLM, ModelConfig
    from attnres.train import TrainConfig

    config = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                         intermediate_size=32, residual="delta_block",
                         residual_options={"num_blocks": 2, "exact_conversion": "gate"})
    model = AttnResLM(config)
    parallel = wrap_model(model, "fsdp", current_env(), TrainConfig(parallel="fsdp").step_settings())
    embed = model.embed_tokens.weight
    Path(f"{out}.{rank}").write_text(json.dumps({
        "tied": model.lm_head.weight is embed,
        "embed": [type(embed).__name__, list(embed.shape), list(embed.to_local().shape)],
        "sharded": sorted(n for n, p in model.named_parameters() if isinstance(p, DTensor)),
        "replicated": sorted(n for n, p in model.named_parameters() if not isinstance(p, DTensor)),
        "replicated_listed": len(parallel.replicated)}))
