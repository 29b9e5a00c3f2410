"""Depth routing kernels: every computation of "mix these sources by these logits" (reference,
memory-lean ops, two-phase group routing, the Triton kernel, the fused C++ CPU kernel) and the choice
among them (`IMPLS`, `resolve_impl`). Knows nothing of methods or models (attnres.methods holds the
mixers that call these)."""

from attnres.routing.lean import inv_rms, route_sources
from attnres.routing.reference import route_reference
from attnres.routing.route import IMPLS, resolve_impl, route_fast
from attnres.routing.two_phase import GroupRouting, RoutedPrefix, merge_remaining, merge_sources, route_group

__all__ = ["IMPLS", "GroupRouting", "RoutedPrefix", "inv_rms", "merge_remaining", "merge_sources", "resolve_impl",
           "route_fast", "route_group", "route_reference", "route_sources"]
