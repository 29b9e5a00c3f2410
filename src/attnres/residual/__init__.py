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
