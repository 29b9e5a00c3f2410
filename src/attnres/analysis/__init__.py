"""Statistics of routing and training: sharpness, entropy, source redundancy, depth statistics,
gradient scale by depth, expert load, and intervals over seeds. Figures and documents are in `attnres.report`."""

from attnres.analysis.depth_stats import DepthStats, collect_depth_stats
from attnres.analysis.expert_load import collect_expert_loads, load_imbalance
from attnres.analysis.grad_norms import collect_grad_norms
from attnres.analysis.intervals import ci95_halfwidth, mean, sample_std, t_quantile_975
from attnres.analysis.redundancy import collect_source_cosines, cosine_matrix
from attnres.analysis.router_stats import RouterSummary, effective_sources, routing_entropy, summarize_routers
from attnres.analysis.sharpness import mean_max_weight, summarize_max_weights, summarize_sharpness

__all__ = ["DepthStats", "RouterSummary", "ci95_halfwidth", "collect_depth_stats", "collect_expert_loads",
           "collect_grad_norms", "load_imbalance",
           "collect_source_cosines", "cosine_matrix", "effective_sources", "mean", "mean_max_weight",
           "routing_entropy", "sample_std", "summarize_max_weights", "summarize_routers",
           "summarize_sharpness", "t_quantile_975"]
