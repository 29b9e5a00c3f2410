"""Depth routing: the router module and the route() implementations. Knows nothing of models."""

from attnres.routing.reference import route_reference
from attnres.routing.router import Router

__all__ = ["Router", "route_reference"]
