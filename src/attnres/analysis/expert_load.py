"""How evenly a mixture-of-experts model spreads its tokens over its experts (attnres.model.moe).

An expert's load is the share of a layer's (token, expert) assignments it receives; a perfectly
balanced layer gives every expert 1 / E. The imbalance of a layer is its largest load over the
mean (1.0: balanced; E: every token on one expert), the quantity DeepSeek-V3's bias update drives down.
"""

from __future__ import annotations

import torch

from attnres.analysis.evaluating import evaluating
from attnres.model import AttnResLM
from attnres.model.sublayer_protocols import FeedForward


def collect_expert_loads(model: AttnResLM, batches: list[torch.Tensor]) -> list[list[float]]:
    """Per feed-forward that counts loads (a mixture-of-experts layer), in depth order, the share of
    assignments each expert received over `batches` (each (B, T) token ids); [] for a model without
    experts. The model is left as found; loads counted and not yet taken before the call are dropped."""
    feed_forwards = [m for m in model.modules() if isinstance(m, FeedForward)]
    with evaluating(model):
        try:
            for feed_forward in feed_forwards:
                feed_forward.count_loads(True)
                feed_forward.after_step(_summed_here, rate=0.0)
            for batch in batches:
                model(batch)
            loads = [feed_forward.after_step(_summed_here, rate=0.0) for feed_forward in feed_forwards]
        finally:
            for feed_forward in feed_forwards:
                feed_forward.count_loads(False)
    return [(load / max(float(load.sum()), 1.0)).cpu().tolist() for load in loads if load is not None]


def _summed_here(loads: torch.Tensor) -> torch.Tensor:
    return loads  # one process: nothing to sum over


def load_imbalance(loads: list[float]) -> float:
    """A layer's largest expert load over the mean load (1.0 when balanced)."""
    return max(loads) * len(loads) / sum(loads) if sum(loads) else float("nan")


__all__ = ["collect_expert_loads", "load_imbalance"]
