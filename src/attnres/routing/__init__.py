"""Depth routing: the router module and the route() implementations. Knows nothing of models."""

from attnres.routing.lean import inv_rms, route_sources
from attnres.routing.reference import route_reference
from attnres.routing.route import IMPLS, resolve_impl, route_fast
from attnres.routing.router import Router

__all__ = ["IMPLS", "Router", "inv_rms", "resolve_impl", "route_fast", "route_reference", "route_sources"]
