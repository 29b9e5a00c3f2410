"""Per-router statistics of routing weights: entropy, effective number of sources, a token-mean summary.

All functions take routing weights over the depth axis, shape (B, T, n) (any leading shape works),
each row non-negative, as returned with `AttnResLM(..., return_routing=True)`: softmax rows sum to 1;
sigmoid routers' rows (the router_weights ablation) need not, and the entropies use their shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnres.analysis.sharpness import mean_max_weight


def routing_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each token's routing weights, in nats.

    weights (B, T, n) -> (B, T): H = -sum_i a_i ln a_i with 0 ln 0 = 0. One-hot rows give 0,
    uniform rows over n sources give ln n. Computed in fp32 (float64 input stays float64).
    Rows are divided by their sum first, so sigmoid routers' weights (which need not sum to 1, the
    router_weights ablation) give the entropy of each source's share of the routing mass. A row with
    a negative weight (DenseFormer's averages) has no entropy: NaN.
    """
    if weights.dim() < 1 or weights.shape[-1] < 1:
        raise ValueError(f"weights must have a non-empty last (source) axis, got shape {tuple(weights.shape)}")
    weights = weights if weights.dtype == torch.float64 else weights.float()  # bf16 would round the log terms
    shares = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    entropy = torch.special.entr(shares).sum(-1)  # entr(x) = -x ln x, entr(0) = 0
    return entropy.masked_fill((weights < 0).any(-1), float("nan"))


def effective_sources(weights: torch.Tensor) -> torch.Tensor:
    """Effective number of sources exp(H) of each token's routing weights (perplexity of the row).

    weights (B, T, n) -> (B, T), in [1, n]: 1 for a one-hot row, n for a uniform row, 2 for
    [0.5, 0.5, 0, ...]. Computed in fp32 (float64 input stays float64).
    """
    return routing_entropy(weights).exp()


@dataclass(frozen=True)
class RouterSummary:
    """Token-mean statistics of one router's weights.

    num_sources:        n, the router's number of sources.
    entropy:            mean over tokens of `routing_entropy`, nats (0 for a single source).
    effective_sources:  mean over tokens of `effective_sources` = exp(H) per token; note this is the
                        mean of exp(H), not exp of the mean H (1 for a single source).
    max_weight:         mean over tokens of the largest weight; None for a single source, as in
                        `mean_max_weight` (its weight is always 1).
    normalized_entropy: entropy / ln n in [0, 1] up to rounding (1 = uniform); None for a single source.
    """

    num_sources: int
    entropy: float
    effective_sources: float
    max_weight: float | None
    normalized_entropy: float | None


def summarize_routers(routing: Sequence[torch.Tensor]) -> list[RouterSummary]:
    """One `RouterSummary` per router, each a plain mean over the router's B * T tokens.

    routing: list of (B, T, n_r) weights, one per router (the `out.routing` of a forward with
    `return_routing=True`). To average over several batches with every token counted once, use
    `collect_depth_stats` (its `entropy` and `effective_sources` fields).
    """
    summaries = []
    for w, max_weight in zip(routing, mean_max_weight(routing)):
        n = w.shape[-1]
        entropy = routing_entropy(w.detach()).double()
        mean_entropy = float(entropy.mean())
        summaries.append(RouterSummary(
            num_sources=n, entropy=mean_entropy, effective_sources=float(entropy.exp().mean()),
            max_weight=max_weight, normalized_entropy=None if n < 2 else mean_entropy / math.log(n)))
    return summaries
