"""The optional dependencies, as the install extras that bring them (pyproject.toml).

`pip install attnres` brings what the drop-in API needs (torch and a few small packages); each
other use has an extra: `attnres[hf]` (conversion, the Hugging Face model, generation), `attnres[train]`
(training, comparisons, reports), `attnres[eval]` (lm-evaluation-harness). A feature whose extra is
missing fails in one line naming it (`missing_extra`), not with a traceback.
"""

from __future__ import annotations

# extra -> the top-level modules it brings that attnres imports (pyproject.toml lists the packages)
EXTRA_MODULES = {
    "hf": ("transformers", "tokenizers", "gguf", "accelerate"),
    "train": ("transformers", "tokenizers", "datasets", "pyarrow", "tensorboard", "tqdm", "matplotlib", "scipy"),
    "eval": ("lm_eval", "transformers", "tokenizers"),
}


def missing_extra(error: ModuleNotFoundError, extra: str) -> str | None:
    """One line saying which module is missing and the extra to install for it (`extra` where it brings
    the module, else the first extra that does); None when no extra brings it (a bug or a broken
    environment: the caller keeps the traceback)."""
    module = (error.name or "").split(".")[0]
    extras = [name for name, modules in EXTRA_MODULES.items() if module in modules]
    if not extras:
        return None
    chosen = extra if extra in extras else extras[0]
    return f"this needs {module}, which the '{chosen}' extra installs: pip install 'attnres[{chosen}]'"
