"""The variant table: every `residual` value as a source policy, a routing mode and a depth mixer.

Adding a depth-mixing method means adding a row here (or calling `register_variant`) with its mixer
class; configs, the model, training, comparison, analysis, benchmarks and the Hugging Face classes
read this table. See docs/how-to/add-a-method.md for a worked example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnres.common.checks import check_choice, check_int, check_positive_number
from attnres.common.errors import InputError
from attnres.common.registry import Registry
from attnres.residual.averaging import AveragingScheme
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy, nearest_num_blocks, valid_num_blocks
from attnres.residual.routed import RoutedScheme
from attnres.residual.scheme import MODES, ResidualScheme, StandardScheme
from attnres.residual.stream_scheme import StreamScheme
from attnres.routing import IMPLS, DepthMixer, DepthWeightedAverage, HyperConnection, ManifoldHyperConnection, Router
from attnres.routing.depth_average import DenseFormerOptions
from attnres.routing.hyper_connections import HyperConnectionOptions
from attnres.routing.mhc import ManifoldHyperConnectionOptions
from attnres.routing.options import REQUIRED, VariantOptions, option
from attnres.routing.router import RouterOptions

SOURCE_KINDS = ("none", "sublayers", "blocks", "states", "streams")
# The scheme class of each routing mode but the routed ones ("replace", "add": `RoutedScheme`).
SCHEMES = {"none": StandardScheme, "average": AveragingScheme, "streams": StreamScheme}
# What each exact_conversion value (method §4) changes: a zero-initialised gate on every mixer, or
# the current block's partial sum as one more source (then the sources sum to x_s).
EXACT_CONVERSIONS = ("gate", "partial")
# The stream variants' fast path recomputes in backward; the routing kernels do not apply.
STREAM_IMPLS = ("auto", "reference", "lean")


@dataclass(frozen=True, kw_only=True)
class BlockCount(VariantOptions):
    """The block count of a variant that mixes blocks of sub-layers (sources "blocks")."""

    num_blocks: int = option(REQUIRED, "N: blocks of ceil(2L / N) sub-layers (a layer has two); "
                             "`attnres.valid_num_blocks(2 * num_layers)` lists the allowed values", kind=int,
                             label="(N={value})", suggested=8)  # the papers' usual N

    @classmethod
    def for_depth(cls, values: dict, num_layers: int) -> dict:
        if isinstance(values.get("num_blocks"), int):
            return {**values, "num_blocks": nearest_num_blocks(2 * num_layers, values["num_blocks"])}
        return values

    @classmethod
    def allowed(cls, name: str, num_layers: int) -> str | None:
        if name != "num_blocks":
            return None
        return (f"an integer from 1 to 2 * num_layers = {2 * num_layers} (blocks count sub-layers); allowed values "
                f"for num_layers={num_layers}: {valid_num_blocks(2 * num_layers)}")

    def check_model(self, num_layers: int, prefix: str, error: type[Exception] = InputError) -> None:
        num_sublayers = 2 * num_layers
        valid = valid_num_blocks(num_sublayers)
        if self.num_blocks > num_sublayers:
            raise error(f"{prefix}num_blocks must be {self.allowed('num_blocks', num_layers)}, got {self.num_blocks!r}")
        if self.num_blocks not in valid:
            size = math.ceil(num_sublayers / self.num_blocks)
            raise error(f"{prefix}num_blocks={self.num_blocks} gives blocks of {size} sub-layers and only "
                        f"{math.ceil(num_sublayers / size)} blocks for {num_sublayers} sub-layers; "
                        f"allowed values: {valid}")


@dataclass(frozen=True, kw_only=True)
class BlockOptions(RouterOptions, BlockCount):
    """Routers over blocks of sub-layers (method §3.2): the block count and the router options."""


@dataclass(frozen=True, kw_only=True)
class DeltaBlockOptions(BlockOptions):
    """Delta Block (method §3.4), with the exact conversion of a standard model (method §4)."""

    exact_conversion: str = option(None, "make the zero-query model reproduce a standard one: 'gate' (a zero "
                                   "scalar gate per router) or 'partial' (the current block's sum as a source)",
                                   kind=str, choices=EXACT_CONVERSIONS, nullable=True, label="[{value}]")

    @property
    def partial_source(self) -> bool:
        return self.exact_conversion == "partial"

    @property
    def gated(self) -> bool:
        return self.exact_conversion == "gate"


@dataclass(frozen=True)
class Variant:
    """One residual variant.

    name:     the `residual` value (ModelConfig.residual, YAML `model.residual`).
    mode:     "none" (h_s = x_s), "replace" (h_s = R_s(...), a final mixer before the head),
              "add" (h_s = x_s + R_s(...)) or "average" (after a layer, the stream becomes a mixture
              of the states so far); see `ResidualScheme`.
    sources:  "none", "sublayers" (the embedding and every sub-layer output), "blocks" (the
              embedding and each completed block's summary; the options give `num_blocks`),
              "states" (the embedding and the stream after each layer; mode "average",
              `StatePolicy`, the options give `dilation` and `period`) or "streams" (n residual
              streams; mode "streams", `StreamPolicy`, the options give `streams`).
    symbol:   how traces name completed sources: "d" (sub-layer output d{s}), "b" (block summary
              b{n}) or "D" (block delta D{n}).
    partial_source: the current block's partial sum is a source once non-empty (the options may
              add it too: `VariantOptions.partial_source`).
    mixer:    the DepthMixer class built for every routed input.
    options:  the variant's options dataclass (`attnres.routing.options.VariantOptions`).
    impls:    the routing implementations (`attnres.routing.IMPLS`) that compute this variant.
    method:   where the variant is specified (a method section or a paper).
    color:    its colour in every figure (None: one picked from its name, the same in every run).
    """

    name: str
    mode: str
    sources: str = "none"
    symbol: str = "d"
    partial_source: bool = False
    mixer: type[DepthMixer] = Router
    options: type[VariantOptions] = VariantOptions
    impls: tuple[str, ...] = IMPLS
    method: str = ""
    color: str | None = None

    def __post_init__(self) -> None:
        check_choice(self.mode, "Variant.mode", MODES)
        check_choice(self.sources, "Variant.sources", SOURCE_KINDS)
        if (self.mode == "none") != (self.sources == "none"):
            raise InputError(f"Variant {self.name!r}: sources are needed exactly when mode is not 'none'")
        if not (isinstance(self.options, type) and issubclass(self.options, VariantOptions)):
            raise InputError(f"Variant {self.name!r}: options must be a VariantOptions dataclass, got {self.options!r}")
        for impl in self.impls:
            check_choice(impl, f"Variant {self.name!r}: impls", IMPLS)

    @property
    def uses_blocks(self) -> bool:
        """Whether the variant routes over blocks (its options give num_blocks)."""
        return self.sources == "blocks"



VARIANTS: Registry[Variant] = Registry("residual variant")


def register_variant(variant: Variant) -> Variant:
    """Add `variant` to the table (a name already there is an error); returns it."""
    return VARIANTS.register(variant)


def unregister_variant(name: str) -> None:
    """Remove a variant added with `register_variant` (for tests and experiments)."""
    VARIANTS.unregister(name)


for _variant in (
    Variant("standard", "none", method="method §1", color="#4d4d4d"),  # dark grey: the neutral reference
    Variant("full_attnres", "replace", "sublayers", "d", options=RouterOptions, method="method §3.1", color="#1f77b4"),
    Variant("block_attnres", "replace", "blocks", "b", partial_source=True, options=BlockOptions,
            method="method §3.2", color="#ff7f0e"),
    Variant("delta_attnres", "add", "sublayers", "d", options=RouterOptions, method="method §3.3", color="#2ca02c"),
    Variant("delta_block", "add", "blocks", "D", options=DeltaBlockOptions, method="method §3.4", color="#d62728"),
    Variant("denseformer", "average", "states", "x", mixer=DepthWeightedAverage, options=DenseFormerOptions,
            method="method §7 (Pagliardini et al., 2024)", color="#9467bd"),
    Variant("hyper_connections", "streams", "streams", "h", mixer=HyperConnection, options=HyperConnectionOptions,
            impls=STREAM_IMPLS, method="method §7.3 (Zhu et al., 2025)", color="#8c564b"),
    Variant("mhc", "streams", "streams", "h", mixer=ManifoldHyperConnection, options=ManifoldHyperConnectionOptions,
            impls=STREAM_IMPLS, method="method §7.3 (DeepSeek, 2025)", color="#e377c2"),
):
    register_variant(_variant)


def variants_with_option(name: str) -> list[str]:
    """The variants whose options include `name`."""
    return [v.name for v in VARIANTS.values() if name in v.options.names()]


def resolve_options(residual: str, options: VariantOptions | dict | None, num_layers: int, *, prefix: str = "",
                    error: type[Exception] = InputError) -> VariantOptions:
    """The options object of variant `residual` for a num_layers-layer model, from an options object,
    a {name: value} dict or None (every default); raises `error` naming `prefix` + the field and the
    allowed values unless `residual` and its options are valid."""
    check_choice(residual, f"{prefix}residual", VARIANTS, error=error)
    kind = VARIANTS[residual].options
    where = f"{prefix}residual_options"
    if isinstance(options, VariantOptions):
        if type(options) is not kind:
            raise error(f"{where}: residual={residual!r} takes {kind.__name__}, got {type(options).__name__}")
    elif options is None or isinstance(options, dict):
        options = kind.from_dict(options, f"{where}.", error, variant=residual, num_layers=num_layers)
    else:
        raise error(f"{where} must be a mapping of {kind.__name__} fields {kind.names()}, got {options!r}")
    options.check_model(num_layers, f"{where}.", error)
    return options


def allowed_impls(residual: str, options: VariantOptions) -> tuple[str, ...]:
    """The routing implementations that compute variant `residual` with `options`: the variant's
    own (`Variant.impls`), and only "auto" and "reference" when the options leave the fast paths."""
    impls = VARIANTS[residual].impls
    return impls if options.fast_paths() else tuple(i for i in impls if i in ("auto", "reference"))


def check_routing(residual: str, options: VariantOptions, num_layers: int, impl: str = "auto",
                  chunk_size: int | None = None, *, prefix: str = "", error: type[Exception] = InputError) -> None:
    """Raise `error` naming `prefix` + routing_impl / routing_chunk_size and the allowed values unless
    the variant computes with routing implementation `impl` and chunk size `chunk_size` (how routing
    is computed, never what: both are run settings, not part of the model). The scheme, built on
    the meta device, decides."""
    variant = VARIANTS[residual]
    check_choice(impl, f"{prefix}routing_impl", IMPLS, error=error)
    allowed = allowed_impls(residual, options)
    if impl not in allowed:
        why = (f"residual={residual!r} with {options} computes with the reference code (the fast paths serve "
               f"the method's router only)" if impl in variant.impls else
               f"residual={residual!r} does not route with it")
        raise error(f"{prefix}routing_impl={impl!r}: {why}; allowed values: {list(allowed)}")
    with torch.device("meta"):
        scheme = build_residual(residual, options, num_layers=num_layers, hidden_size=8)
    scheme.set_routing(impl, chunk_size, prefix=prefix, error=error)


def source_policy(residual: str, options: VariantOptions, num_layers: int) -> SourcePolicy | StatePolicy | StreamPolicy | None:
    """The SourcePolicy (StatePolicy for "states", StreamPolicy for "streams") of a valid variant and
    its options, None for one without sources."""
    variant = VARIANTS[residual]
    num_sublayers = 2 * num_layers
    if variant.sources == "none":
        return None
    if variant.sources == "states":
        return StatePolicy(num_layers, options.dilation, options.period, symbol=variant.symbol)
    if variant.sources == "streams":
        return StreamPolicy(num_sublayers, options.streams, symbol=variant.symbol)
    partial = variant.partial_source or options.partial_source
    if variant.sources == "sublayers":
        return SourcePolicy(num_sublayers, 1, partial_source=partial, symbol=variant.symbol)
    return SourcePolicy.blocks(num_sublayers, options.num_blocks, partial_source=partial, symbol=variant.symbol)


def variant_label(residual: str, options: VariantOptions | None = None) -> str:
    """Display name of a variant: its name and the options that differ from their defaults, e.g.
    "block_attnres (N=4)", "hyper_connections [static]" or "delta_block (N=2) [gate]"."""
    return " ".join([residual, *(options.labels() if options is not None else [])])


def build_residual(residual: str = "standard", options: VariantOptions | dict | None = None, *, num_layers: int,
                   hidden_size: int, eps: float = 1e-6, init_std: float = 0.02, routing_impl: str = "auto",
                   chunk_size: int | None = None, **option_values) -> ResidualScheme:
    """The ResidualScheme of variant `residual` for a model of `num_layers` layers (2 * num_layers
    sub-layers, attention and MLP alternating) of width `hidden_size` (method §3 and §4).

    options: the variant's options (`VARIANTS[residual].options`): an options object, a dict, or
    None, and any of them given as keywords too (None there means not given):
    `build_residual("delta_block", num_layers=12, hidden_size=768, num_blocks=4)`. eps: the RMSNorm epsilon of the routers' keys. init_std: the
    model's weight init std, for mixers that draw random weights (mHC's projections).
    routing_impl (one of `attnres.routing.IMPLS`) and chunk_size (per-sub-layer variants: routers
    per chunk of two-phase routing; None: `auto_chunk_size`) choose how routing is computed, never
    what; `ResidualScheme.set_routing` changes them later. Raises InputError naming the argument for
    an invalid combination. The scheme is the drop-in API for a model loop of one's own
    (docs/how-to/drop-in.md).
    """
    check_int(num_layers, "build_residual num_layers")  # is_int refuses True: a bool is no layer count
    check_int(hidden_size, "build_residual hidden_size")
    check_positive_number(eps, "build_residual eps")
    check_positive_number(init_std, "build_residual init_std")
    option_values = {name: value for name, value in option_values.items() if value is not None}
    if option_values:
        if isinstance(options, VariantOptions):
            options = options.to_dict()
        options = {**(options or {}), **option_values}
    options = resolve_options(residual, options, num_layers)
    variant = VARIANTS[residual]
    mixer_options = {**options.mixer_options(), **({"init_std": init_std} if variant.mixer.takes_init_std else {})}
    policy = source_policy(residual, options, num_layers)
    impls = allowed_impls(residual, options)
    if variant.mode in ("replace", "add"):
        scheme = RoutedScheme(2 * num_layers, policy, hidden_size, eps, variant.mixer, mixer_options, impls,
                              replace=variant.mode == "replace")
    else:
        scheme = SCHEMES[variant.mode](2 * num_layers, policy, hidden_size, eps, variant.mixer, mixer_options, impls)
    scheme.set_routing(routing_impl, chunk_size)
    return scheme
