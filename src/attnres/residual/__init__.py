"""Residual schemes: source policies and routing modes over the one router."""

from attnres.residual.policy import SourcePolicy
from attnres.residual.scheme import ResidualScheme, StreamState
from attnres.residual.variants import build_residual

__all__ = ["ResidualScheme", "SourcePolicy", "StreamState", "build_residual"]
