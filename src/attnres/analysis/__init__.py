"""Routing diagnostics."""

from attnres.analysis.sharpness import mean_max_weight, summarize_sharpness

__all__ = ["mean_max_weight", "summarize_sharpness"]
