"""Residual schemes: which sources each sub-layer input may mix (source policies), how (routing modes),
and building a variant of the table (attnres.methods) with its options. The scheme is also the
drop-in public API."""

from attnres.methods import (MODES, REQUIRED, VARIANTS, BlockCount, BlockOptions, DeltaBlockOptions, Variant,
                             VariantOptions, nearest_num_blocks, option, register_variant, unregister_variant,
                             valid_num_blocks)
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy
from attnres.residual.averaging import AveragingScheme
from attnres.residual.routed import FastRouting, RoutedScheme
from attnres.residual.scheme import ResidualScheme, StandardScheme, StreamState, check_chunk_size
from attnres.residual.stream_scheme import StreamScheme
from attnres.residual.variants import (allowed_impls, build_residual, check_routing, resolve_options, source_policy,
                                       variant_label, variants_with_option)

__all__ = ["MODES", "REQUIRED", "VARIANTS", "AveragingScheme", "BlockCount", "BlockOptions", "DeltaBlockOptions",
           "FastRouting", "ResidualScheme", "RoutedScheme", "SourcePolicy", "StandardScheme", "StatePolicy",
           "StreamPolicy", "StreamScheme", "StreamState", "Variant", "VariantOptions", "allowed_impls",
           "build_residual", "check_chunk_size", "check_routing", "nearest_num_blocks", "option", "register_variant",
           "resolve_options", "source_policy", "unregister_variant", "valid_num_blocks", "variant_label",
           "variants_with_option"]
