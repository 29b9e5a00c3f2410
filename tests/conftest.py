"""Session-wide test settings."""

import os

import pytest
import torch

from attnres.report import plots

# Without a GPU, Triton kernels run on CPU tensors under Triton's interpreter; it has to be chosen
# before the first kernel is decorated, so it is set once here for every test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def captured_figures(monkeypatch):
    """Every matplotlib Figure the report saves, by file name, to check what a reader sees."""
    figures = {}
    original = plots.save_figure

    def save(fig, path):
        figures[str(path).rsplit("/", 1)[-1]] = fig
        return original(fig, path)

    monkeypatch.setattr(plots, "save_figure", save)
    return figures
