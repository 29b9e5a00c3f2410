"""Routing sharpness: how concentrated each router's softmax weights are."""

from __future__ import annotations

import torch


def mean_max_weight(routing: list[torch.Tensor]) -> list[float | None]:
    """Per router, the token-average of the largest routing weight.

    routing: list of (B, T, n_sources) weights (as returned with `return_routing=True`).
    Returns one float per router; None for a router with a single source (its weight is always 1).
    Uniform weights over n sources give 1/n; a router that picks one source gives 1.
    """
    return [None if w.shape[-1] < 2 else float(w.amax(-1).double().mean()) for w in routing]  # float64: no rounding drift over many tokens


def summarize_sharpness(routing: list[torch.Tensor], deep_fraction: float = 1 / 3) -> dict[str, float | None]:
    """Mean of `mean_max_weight` over all multi-source routers and over the deepest `deep_fraction`.

    Returns {"max_weight": ..., "max_weight_deep": ...}; None where no router has two sources.
    """
    return summarize_max_weights(mean_max_weight(routing), deep_fraction)


def summarize_max_weights(max_weights: list[float | None], deep_fraction: float = 1 / 3) -> dict[str, float | None]:
    """`summarize_sharpness` from per-router max weights already averaged (None: single source)."""
    values = [v for v in max_weights if v is not None]
    if not values:
        return {"max_weight": None, "max_weight_deep": None}
    deep = values[len(values) - max(1, round(len(values) * deep_fraction)):]
    return {"max_weight": sum(values) / len(values), "max_weight_deep": sum(deep) / len(deep)}
