"""The names that attnres 0.1.0 gave a variant's options and the routing settings.

In 0.1.0 each option was a flat `ModelConfig` field and a flat `build_residual` keyword, named after
its variant (`router_query`, `hc_streams`, ...); today they are the fields of the variant's options
(`query`, `streams`, ...). Loading old files translates them silently (`attnres.residual.legacy`);
the Python keywords of those names were removed in 0.3.0.
"""

from __future__ import annotations

# old ModelConfig field -> (the option's name now, the old value that meant "not set")
FLAT_OPTIONS = {"num_blocks": ("num_blocks", None), "exact_conversion": ("exact_conversion", None),
                "router_query": ("query", "static"), "router_weights": ("weights", "softmax"),
                "router_key_norm": ("key_norm", True), "denseformer_dilation": ("dilation", 1),
                "denseformer_period": ("period", 1), "hc_streams": ("streams", None),
                "hc_dynamic": ("dynamic", None), "hc_sinkhorn_iters": ("sinkhorn_iters", None)}
# old ModelConfig fields that are run settings now -> their default
RUN_SETTINGS = {"routing_impl": "auto", "routing_chunk_size": None}
