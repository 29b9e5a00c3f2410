"""Two-phase routing (method §5): route a group of static queries over shared sources in one call,
then merge each router's result with later sources by online softmax.

Phase 1 (`route_group`) reads each shared source once for the whole group and keeps, per router, the
weighted sum, the log-sum-exp of its logits and its weights. Phase 2 (`merge_source`) folds one more
source into one router's phase-1 result: one more logit, `logaddexp`, two per-token rescalings. The
result is exactly softmax routing over all the sources; statistics stay in fp32 (float64 for float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnres.common.precision import autocast_off
from attnres.routing.lean import inv_rms
from attnres.routing.route import route_fast


@dataclass(frozen=True)
class RoutedPrefix:
    """One router's softmax routing over the first `num_sources` of its sources.

    query (D,): the router's effective query w * g as routed; mixed (B, T, D); lse (B, T) fp32, the
    log-sum-exp of the logits so far; weights (B, T, num_sources) fp32, or None when not kept.
    """

    query: Tensor
    mixed: Tensor
    lse: Tensor
    weights: Tensor | None
    num_sources: int


@dataclass(frozen=True)
class GroupRouting:
    """Phase 1 of a group of routers, kept for one forward pass (the scheme's per-pass cache).

    first: the index of the group's first router; queries (S, D); mixed (S, B, T, D); lse (S, B, T);
    weights (S, B, T, n), all over the same n shared sources.
    """

    first: int
    queries: Tensor
    mixed: Tensor
    lse: Tensor
    weights: Tensor

    def prefix(self, index: int) -> RoutedPrefix:
        """The phase-1 result of router `first + index`."""
        return RoutedPrefix(self.queries[index], self.mixed[index], self.lse[index], self.weights[index],
                            self.weights.shape[-1])


def route_group(first: int, queries: Tensor, sources: list[Tensor], inv: list[Tensor], impl: str) -> GroupRouting:
    """Phase 1: the S routers first .. first + S - 1, with effective queries (S, D), over n shared
    sources (B, T, D) whose inverse RMS (B, T) are `inv`, in one call of implementation `impl`."""
    return GroupRouting(first, queries, *route_fast(queries, sources, inv, impl))


def merge_source(prefix: RoutedPrefix, source: Tensor, eps: float, need_weights: bool = True) -> RoutedPrefix:
    """Phase 2: softmax routing over prefix's sources plus `source` (B, T, D), from the prefix alone.

    The new logit is inv_rms(source) * <query, source> in fp32, as the reference computes keys.
    Returns the routing over num_sources + 1 sources: mixed (B, T, D) in the promoted dtype of the
    prefix's mixture and the source; weights (B, T, n + 1) fp32 when need_weights and the prefix
    kept its weights, else None.
    """
    width = source.shape[-1]
    lse = prefix.lse
    with autocast_off(source.device):  # fp32 logits, like the reference
        query = prefix.query.to(lse.dtype)
        logit = (source.reshape(-1, width).to(lse.dtype) @ query).reshape(lse.shape)
        logit = logit * inv_rms(source, eps)
        total = torch.logaddexp(lse, logit)
        keep, take = torch.exp(lse - total), torch.exp(logit - total)
        merged = keep.unsqueeze(-1) * prefix.mixed + take.unsqueeze(-1) * source
    merged = merged.to(torch.promote_types(prefix.mixed.dtype, source.dtype))
    weights = None
    if need_weights and prefix.weights is not None:
        weights = torch.cat([prefix.weights * keep.unsqueeze(-1), take.unsqueeze(-1)], dim=-1)
    return RoutedPrefix(prefix.query, merged, total, weights, prefix.num_sources + 1)
