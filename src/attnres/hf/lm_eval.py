"""lm-evaluation-harness on attnres models, through its Hugging Face backend.

transformers finds the "attnres" model type once `attnres.hf` is imported, so lm-eval's own `hf`
model class evaluates converted and trained attnres checkpoints unchanged, in this process.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import attnres.hf  # noqa: F401  (registers the Auto classes before lm-eval loads the model)
from attnres.common.checks import check_int
from attnres.common.errors import InputError
from attnres.hf.model_dir import check_model_dir, load_tokenizer

# The Delta paper's zero-shot suite (needs hub access for the datasets).
PAPER_TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu", "lambada_openai")


def parse_tasks(text: str) -> list[str]:
    """--tasks: comma-separated lm-eval task names, or "paper" for the Delta paper's eight."""
    tasks = list(PAPER_TASKS) if text == "paper" else [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise InputError(f"--tasks must name lm-eval tasks, comma-separated (e.g. arc_easy,piqa), or 'paper'; "
                         f"got {text!r}")
    return tasks


def check_lm_eval_options(batch_size: int, limit: int | None, include_path: str | Path | None,
                          out: str | Path | None, force: bool = False) -> None:
    """`attnres lm-eval`'s numbers and paths, refused before the model loads, each naming its flag; an
    existing --out file is replaced only with `force`."""
    check_int(batch_size, "--batch-size")
    if limit is not None:
        check_int(limit, "--limit")
    if include_path is not None and not Path(include_path).is_dir():
        raise InputError(f"--include-path {include_path} is not a folder; give a folder of task YAML files")
    if out and (Path(out).is_dir() or not Path(out).parent.is_dir()):
        raise InputError(f"--out {out}: give a file path in an existing folder (the results JSON is written there)")
    if out and Path(out).exists() and not force:
        raise InputError(f"--out {out} exists; give a new file path, or pass --force to replace it")


def run_lm_eval(model_dir: str | Path, tasks: list[str], include_path: str | Path | None = None,
                batch_size: int = 1, limit: int | None = None, device: str = "cpu", dtype: str = "float32") -> dict:
    """Evaluate the Hugging Face-format attnres model in `model_dir` on lm-eval `tasks`.

    include_path: a folder of extra task YAMLs (e.g. local `dataset_path: json` tasks). batch_size > 1
    pads: lm-eval right-pads scoring batches (no mask needed, attention is causal) and left-pads
    generation batches with an attention_mask, which AttnResForCausalLM honours, so scores equal
    those at batch size 1. Returns lm-eval's "results" dict: {task: {"acc,none": ..., ...}}. Raises
    InputError, before lm-eval starts, for a directory that is not such a model (`check_model_dir`) or
    has no tokenizer, and for a task lm-eval does not know.
    """
    check_model_dir(model_dir)  # before lm-eval, whose errors for these are tracebacks (a missing path: a hub id)
    load_tokenizer(model_dir)
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError("attnres lm-eval needs lm-evaluation-harness: pip install 'attnres[eval]'") from None
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    for task in tasks:
        if task not in manager.all_tasks and not Path(task).is_file():
            close = difflib.get_close_matches(task, manager.all_tasks, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise InputError(f"--tasks: {task!r} is not an lm-eval task or task YAML file{hint}; `lm-eval ls tasks` "
                             f"lists them, --include-path adds a folder of your own")
    output = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype={dtype}", tasks=list(tasks),
                                     task_manager=manager, device=device, batch_size=batch_size, limit=limit)
    return output["results"]
