"""Residual schemes: which sources each sub-layer input may mix (source policies), how (routing modes),
and the variant table naming every `residual` value with its options. The scheme is also the drop-in
public API."""

from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy, nearest_num_blocks, valid_num_blocks
from attnres.residual.averaging import AveragingScheme
from attnres.residual.routed import FastRouting, RoutedScheme
from attnres.residual.scheme import MODES, ResidualScheme, StandardScheme, StreamState, check_chunk_size
from attnres.residual.stream_scheme import StreamScheme
from attnres.residual.variants import (VARIANTS, BlockCount, BlockOptions, DeltaBlockOptions, Variant, allowed_impls,
                                       build_residual, check_routing, register_variant, resolve_options,
                                       source_policy, unregister_variant, variant_label, variants_with_option)
from attnres.routing.options import REQUIRED, VariantOptions, option

__all__ = ["MODES", "REQUIRED", "VARIANTS", "AveragingScheme", "BlockCount", "BlockOptions", "DeltaBlockOptions",
           "FastRouting", "ResidualScheme", "RoutedScheme", "SourcePolicy", "StandardScheme", "StatePolicy",
           "StreamPolicy", "StreamScheme", "StreamState", "Variant", "VariantOptions", "allowed_impls",
           "build_residual", "check_chunk_size", "check_routing", "nearest_num_blocks", "option", "register_variant", "resolve_options",
           "source_policy", "unregister_variant", "valid_num_blocks", "variant_label", "variants_with_option"]

# Names of 0.1.0 with no exact successor, since the variant options became typed (0.2.0): asking for
# one fails in one line naming what to use. An ImportError, because `from attnres.residual import
# name` is how they were used, and an AttributeError's message is lost on that path.
REMOVED = {
    "STREAM_OPTIONS": "VARIANTS['hyper_connections'].options.names() (each variant's options are a dataclass)",
    "block_variants": "variants_with_option('num_blocks')",
    "check_residual": "resolve_options(residual, options, num_layers)",
    "check_router_options": "resolve_options(residual, options, num_layers); the router options are the fields "
                            "query, weights and key_norm",
    "check_stream_options": "resolve_options(residual, options, num_layers) and check_routing(residual, options, "
                            "num_layers, impl)",
    "router_options": "VARIANTS[residual].options(query=..., weights=..., key_norm=...).mixer_options()",
    "stream_options": "resolve_options(residual, None, num_layers) (the options with their defaults)",
}


def __getattr__(name: str):
    if name in REMOVED:
        raise ImportError(f"attnres.residual.{name} was removed in attnres 0.2.0; use {REMOVED[name]}",
                          name=__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
