"""lm-evaluation-harness on attnres models, through its Hugging Face backend.

transformers finds the "attnres" model type once `attnres.hf` is imported, so lm-eval's own `hf`
model class evaluates converted and trained attnres checkpoints unchanged, in this process.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import attnres.hf  # noqa: F401  (registers the Auto classes before lm-eval loads the model)
from attnres.common.errors import InputError
from attnres.hf.model_dir import check_model_dir, load_tokenizer

# The Delta paper's zero-shot suite (needs hub access for the datasets).
PAPER_TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu", "lambada_openai")


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
