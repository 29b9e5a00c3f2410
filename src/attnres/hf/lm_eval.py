"""lm-evaluation-harness on attnres models, through its Hugging Face backend.

transformers finds the "attnres" model type once `attnres.hf` is imported, so lm-eval's own `hf`
model class evaluates converted and trained attnres checkpoints unchanged, in this process.
"""

from __future__ import annotations

from pathlib import Path

import attnres.hf  # noqa: F401  (registers the Auto classes before lm-eval loads the model)

# The Delta paper's zero-shot suite (needs hub access for the datasets).
PAPER_TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu", "lambada_openai")


def run_lm_eval(model_dir: str | Path, tasks: list[str], include_path: str | Path | None = None,
                batch_size: int = 1, limit: int | None = None, device: str = "cpu", dtype: str = "float32") -> dict:
    """Evaluate the Hugging Face-format attnres model in `model_dir` on lm-eval `tasks`.

    include_path: a folder of extra task YAMLs (e.g. local `dataset_path: json` tasks). batch_size > 1
    pads: lm-eval right-pads scoring batches (no mask needed, attention is causal) and left-pads
    generation batches with an attention_mask, which AttnResForCausalLM honours, so scores equal
    those at batch size 1. Returns lm-eval's "results" dict: {task: {"acc,none": ..., ...}}.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include_path) if include_path else None)
    output = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype={dtype}", tasks=list(tasks),
                                     task_manager=manager, device=device, batch_size=batch_size, limit=limit)
    return output["results"]
