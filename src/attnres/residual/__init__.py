"""Residual schemes: which sources each sub-layer input may mix (source policies), how (routing modes),
and the variant table naming every `residual` value. The scheme is also the drop-in public API."""

from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy, valid_num_blocks
from attnres.residual.scheme import MODES, ResidualScheme, StreamState, check_chunk_size
from attnres.residual.variants import (STREAM_OPTIONS, VARIANTS, Variant, block_variants, build_residual,
                                       check_residual, check_router_options, check_stream_options, router_options,
                                       stream_options,
                                       register_variant, source_policy, unregister_variant)

__all__ = ["MODES", "STREAM_OPTIONS", "VARIANTS", "ResidualScheme", "SourcePolicy", "StatePolicy", "StreamPolicy",
           "StreamState", "Variant", "block_variants", "build_residual", "check_chunk_size", "check_residual",
           "check_router_options", "check_stream_options", "stream_options", "register_variant", "router_options", "source_policy", "unregister_variant",
           "valid_num_blocks"]
