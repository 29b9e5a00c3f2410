"""Routing diagnostics: sharpness, entropy, source redundancy, depth statistics, and their plots."""

from attnres.analysis.depth_stats import DepthStats, collect_depth_stats
from attnres.analysis.grad_norms import collect_grad_norms
from attnres.analysis.redundancy import collect_source_cosines, cosine_matrix
from attnres.analysis.router_stats import RouterSummary, effective_sources, routing_entropy, summarize_routers
from attnres.analysis.sharpness import mean_max_weight, summarize_max_weights, summarize_sharpness

__all__ = ["DepthStats", "RouterSummary", "collect_depth_stats", "collect_grad_norms", "collect_source_cosines",
           "cosine_matrix", "effective_sources", "mean_max_weight", "routing_entropy", "summarize_max_weights",
           "summarize_routers", "summarize_sharpness"]
