"""Routing sharpness on hand-built weights with known answers."""

import pytest
import torch

from attnres.analysis import mean_max_weight, summarize_sharpness


def test_mean_max_weight_known_values():
    uniform = torch.full((2, 3, 4), 0.25)
    one_hot = torch.zeros(2, 3, 2)
    one_hot[..., 1] = 1.0
    mixed = torch.tensor([[[0.7, 0.3], [0.4, 0.6]]])  # max weights 0.7 and 0.6
    single = torch.ones(2, 3, 1)
    assert mean_max_weight([single, uniform, one_hot, mixed]) == [None, 0.25, 1.0, pytest.approx(0.65, abs=1e-7)]


def test_summary_over_all_and_deepest_third():
    routing = [torch.ones(1, 1, 1)] + [torch.tensor([[[v, 1 - v]]]) for v in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)]
    summary = summarize_sharpness(routing)
    assert abs(summary["max_weight"] - 0.75) < 1e-6
    assert abs(summary["max_weight_deep"] - 0.95) < 1e-6  # the last two of six multi-source routers


def test_summary_without_multi_source_routers():
    assert summarize_sharpness([torch.ones(1, 2, 1)]) == {"max_weight": None, "max_weight_deep": None}
    assert summarize_sharpness([]) == {"max_weight": None, "max_weight_deep": None}
