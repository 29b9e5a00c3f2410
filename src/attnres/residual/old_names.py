"""The names that attnres 0.1.0 gave a variant's options and the routing settings.

In 0.1.0 each option was a flat `ModelConfig` field and a flat `build_residual` keyword, named after
its variant (`router_query`, `hc_streams`, ...); today they are the fields of the variant's options
(`query`, `streams`, ...). Loading old files translates them silently (`attnres.residual.legacy`);
code that still spells them gets a DeprecationWarning (`attnres.common.deprecation`).
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
# the old names that are no longer any option's name (num_blocks and exact_conversion kept theirs)
RENAMED_OPTIONS = {old: new for old, (new, _) in FLAT_OPTIONS.items() if old != new}


def renamed_option_values(values: dict, option_names: tuple[str, ...]) -> dict:
    """Today's option values from keywords spelled with RENAMED_OPTIONS' old names: {new name: value}.

    As in 0.1.0, None, or the old default for a variant without that option, means "not given" and
    is dropped (build_residual("standard", router_query="static") built a standard scheme); any
    other value is kept for the options' own check to accept or refuse.
    """
    kept = {}
    for old, value in values.items():
        new, unset = FLAT_OPTIONS[old]
        if value is None or (value == unset and new not in option_names):
            continue
        kept[new] = value
    return kept
