"""Routing diagnostics: sharpness, depth statistics, and their plots."""

from attnres.analysis.depth_stats import DepthStats, collect_depth_stats
from attnres.analysis.sharpness import mean_max_weight, summarize_max_weights, summarize_sharpness

__all__ = ["DepthStats", "collect_depth_stats", "mean_max_weight", "summarize_max_weights", "summarize_sharpness"]
