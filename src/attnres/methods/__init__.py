"""The depth-mixing methods: each built-in method's file holds its mixer, its options and its rows of
the variant table (`VARIANTS`), all registered when this package is imported. Between the routing
kernels (attnres.routing), which the mixers call, and the residual loop (attnres.residual), which
builds a row's scheme."""

from attnres.methods.depth_mixer import DepthMixer, MixerFlops
from attnres.methods.options import REQUIRED, VariantOptions, option
from attnres.methods.router import QUERY_KINDS, WEIGHT_KINDS, Router, RouterOptions
from attnres.methods.variant import MODES, SOURCE_KINDS, VARIANTS, Variant, register_variant, unregister_variant
from attnres.methods.attention_residuals import BlockCount, BlockOptions, nearest_num_blocks, valid_num_blocks
from attnres.methods.delta_attention_residuals import EXACT_CONVERSIONS, DeltaBlockOptions
from attnres.methods.denseformer import DenseFormerOptions, DepthWeightedAverage
from attnres.methods.stream_mixer import STREAM_IMPLS, StreamMixer
from attnres.methods.hyper_connections import HyperConnection, HyperConnectionOptions
from attnres.methods.mhc import ManifoldHyperConnection, ManifoldHyperConnectionOptions

__all__ = ["EXACT_CONVERSIONS", "MODES", "QUERY_KINDS", "REQUIRED", "SOURCE_KINDS", "STREAM_IMPLS", "VARIANTS",
           "WEIGHT_KINDS", "BlockCount", "BlockOptions", "DeltaBlockOptions", "DenseFormerOptions", "DepthMixer",
           "DepthWeightedAverage", "HyperConnection", "HyperConnectionOptions", "ManifoldHyperConnection",
           "ManifoldHyperConnectionOptions", "MixerFlops", "Router", "RouterOptions", "StreamMixer", "Variant",
           "VariantOptions", "nearest_num_blocks", "option", "register_variant", "unregister_variant",
           "valid_num_blocks"]
