"""Depth routing: the mixer protocol, the Router, and every routing computation (reference, memory-lean
ops, two-phase group routing, the Triton kernel). Knows nothing of models."""

from attnres.routing.depth_average import DepthWeightedAverage
from attnres.routing.hyper_connections import HyperConnection
from attnres.routing.mhc import ManifoldHyperConnection
from attnres.routing.stream_mixer import StreamMixer
from attnres.routing.lean import inv_rms, route_sources
from attnres.routing.mixer import DepthMixer, MixerFlops
from attnres.routing.reference import route_reference
from attnres.routing.route import IMPLS, resolve_impl, route_fast
from attnres.routing.router import QUERY_KINDS, WEIGHT_KINDS, Router
from attnres.routing.two_phase import GroupRouting, RoutedPrefix, merge_remaining, merge_sources, route_group

__all__ = ["IMPLS", "QUERY_KINDS", "WEIGHT_KINDS", "DepthMixer", "DepthWeightedAverage", "GroupRouting", "HyperConnection",
           "MixerFlops",
           "ManifoldHyperConnection", "RoutedPrefix", "Router", "StreamMixer", "inv_rms", "merge_remaining", "merge_sources",
           "resolve_impl", "route_fast", "route_group", "route_reference", "route_sources"]
