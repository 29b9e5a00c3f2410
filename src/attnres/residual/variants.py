"""The variant table: every `residual` value as a source policy, a routing mode and a depth mixer.

Adding a depth-mixing method means adding a row here (or calling `register_variant`) with its mixer
class; configs, the model, training, comparison, analysis, benchmarks and the Hugging Face classes
read this table. See docs/how-to/add-a-method.md for a worked example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnres.common.checks import check_bool, check_choice, is_int
from attnres.common.errors import InputError
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy, valid_num_blocks
from attnres.residual.scheme import MODES, ResidualScheme
from attnres.routing import (IMPLS, QUERY_KINDS, WEIGHT_KINDS, DepthMixer, DepthWeightedAverage, HyperConnection,
                             ManifoldHyperConnection, Router)

SOURCE_KINDS = ("none", "sublayers", "blocks", "states", "streams")
# What each exact_conversion value (method §4) changes: a zero-initialised gate on every mixer, or
# the current block's partial sum as one more source (then the sources sum to x_s).
EXACT_CONVERSIONS = ("gate", "partial")
# The Router options of method §2, which the router ablations (method §7) change.
ROUTER_DEFAULTS = {"query": "static", "weights": "softmax", "key_norm": True}
# The stream variants' options (method §7.3): ModelConfig field -> (the variants it applies to, the
# papers' default, the mixer option it sets or None). None in a config means the default.
STREAM_OPTIONS = {"hc_streams": (("hyper_connections", "mhc"), 4, None),
                  "hc_dynamic": (("hyper_connections",), True, "dynamic"),
                  "hc_sinkhorn_iters": (("mhc",), 20, "sinkhorn_iters")}
# The stream variants' fast path recomputes in backward; the routing kernels do not apply.
STREAM_IMPLS = ("auto", "reference", "lean")


@dataclass(frozen=True)
class Variant:
    """One residual variant.

    name:     the `residual` value (ModelConfig.residual, YAML `model.residual`).
    mode:     "none" (h_s = x_s), "replace" (h_s = R_s(...), a final mixer before the head),
              "add" (h_s = x_s + R_s(...)) or "average" (after a layer, the stream becomes a mixture
              of the states so far); see `ResidualScheme`.
    sources:  "none", "sublayers" (the embedding and every sub-layer output), "blocks" (the
              embedding and each completed block's summary; needs num_blocks), "states" (the
              embedding and the stream after each layer; mode "average", `StatePolicy`) or
              "streams" (n residual streams; mode "streams", `StreamPolicy`).
    symbol:   how traces name completed sources: "d" (sub-layer output d{s}), "b" (block summary
              b{n}) or "D" (block delta D{n}).
    partial_source: the current block's partial sum is a source once non-empty.
    mixer:    the DepthMixer class built for every routed input.
    exact_conversions: the ModelConfig.exact_conversion values this variant accepts.
    method:   where the variant is specified (a method section or a paper).
    """

    name: str
    mode: str
    sources: str = "none"
    symbol: str = "d"
    partial_source: bool = False
    mixer: type[DepthMixer] = Router
    exact_conversions: tuple[str, ...] = ()
    method: str = ""

    def __post_init__(self) -> None:
        check_choice(self.mode, "Variant.mode", MODES)
        check_choice(self.sources, "Variant.sources", SOURCE_KINDS)
        if (self.mode == "none") != (self.sources == "none"):
            raise InputError(f"Variant {self.name!r}: sources are needed exactly when mode is not 'none'")
        for value in self.exact_conversions:
            check_choice(value, f"Variant {self.name!r}: exact_conversions", EXACT_CONVERSIONS)

    @property
    def uses_blocks(self) -> bool:
        """Whether the variant needs num_blocks."""
        return self.sources == "blocks"


VARIANTS: dict[str, Variant] = {}


def register_variant(variant: Variant) -> Variant:
    """Add `variant` to the table (a name already there is an error); returns it."""
    if variant.name in VARIANTS:
        raise InputError(f"residual variant {variant.name!r} is already registered")
    VARIANTS[variant.name] = variant
    return variant


def unregister_variant(name: str) -> None:
    """Remove a variant added with `register_variant` (for tests and experiments)."""
    VARIANTS.pop(name)


for _variant in (
    Variant("standard", "none", method="method §1"),
    Variant("full_attnres", "replace", "sublayers", "d", method="method §3.1"),
    Variant("block_attnres", "replace", "blocks", "b", partial_source=True, method="method §3.2"),
    Variant("delta_attnres", "add", "sublayers", "d", method="method §3.3"),
    Variant("delta_block", "add", "blocks", "D", exact_conversions=EXACT_CONVERSIONS, method="method §3.4"),
    Variant("denseformer", "average", "states", "x", mixer=DepthWeightedAverage,
            method="method §7 (Pagliardini et al., 2024)"),
    Variant("hyper_connections", "streams", "streams", "h", mixer=HyperConnection,
            method="method §7.3 (Zhu et al., 2025)"),
    Variant("mhc", "streams", "streams", "h", mixer=ManifoldHyperConnection, method="method §7.3 (DeepSeek, 2025)"),
):
    register_variant(_variant)


def block_variants() -> list[str]:
    """Names of the variants that take num_blocks."""
    return [name for name, variant in VARIANTS.items() if variant.uses_blocks]


def check_residual(residual: str, num_layers: int, num_blocks: int | None = None,
                   exact_conversion: str | None = None, *, prefix: str = "",
                   error: type[Exception] = InputError, dilation: int = 1, period: int = 1) -> None:
    """Raise `error` naming the field (`prefix` + name) and the allowed values unless `residual`,
    `num_blocks`, `exact_conversion` and the averaging layout (`dilation`, `period`: fields
    denseformer_dilation / denseformer_period) describe a valid variant of a num_layers-layer model."""
    check_choice(residual, f"{prefix}residual", VARIANTS, error=error)
    variant = VARIANTS[residual]
    averaging = [name for name, v in VARIANTS.items() if v.sources == "states"]
    for field, value in (("denseformer_dilation", dilation), ("denseformer_period", period)):
        if variant.sources == "states":
            if not is_int(value) or not 1 <= value <= num_layers:
                raise error(f"{prefix}{field} must be an integer from 1 to num_layers = {num_layers}, got {value!r}")
        elif value != 1:
            raise error(f"{prefix}{field} applies only to residual in {averaging}; leave it 1 for "
                        f"residual={residual!r} (got {value!r})")
    num_sublayers = 2 * num_layers
    valid = valid_num_blocks(num_sublayers)
    if variant.uses_blocks:
        if num_blocks is None:
            raise error(f"{prefix}num_blocks is required for residual={residual!r}; allowed values "
                        f"for num_layers={num_layers}: {valid}")
        if not is_int(num_blocks) or not 1 <= num_blocks <= num_sublayers:
            raise error(f"{prefix}num_blocks must be an integer from 1 to 2 * num_layers = {num_sublayers} "
                        f"(blocks count sub-layers); allowed values: {valid}, got {num_blocks!r}")
        if num_blocks not in valid:
            size = math.ceil(num_sublayers / num_blocks)
            raise error(f"{prefix}num_blocks={num_blocks} gives blocks of {size} sub-layers and only "
                        f"{math.ceil(num_sublayers / size)} blocks for {num_sublayers} sub-layers; "
                        f"allowed values: {valid}")
    elif num_blocks is not None:
        raise error(f"{prefix}num_blocks applies only to residual in {block_variants()}; leave it None for "
                    f"residual={residual!r} (got {num_blocks!r})")
    if exact_conversion is not None:
        if not variant.exact_conversions:
            accepting = [name for name, v in VARIANTS.items() if v.exact_conversions]
            which = f"residual={accepting[0]!r}" if len(accepting) == 1 else f"residual in {accepting}"
            raise error(f"{prefix}exact_conversion applies only to {which}; leave it None for "
                        f"residual={residual!r} (got {exact_conversion!r})")
        check_choice(exact_conversion, f"{prefix}exact_conversion", variant.exact_conversions, allow_none=True,
                     error=error)


def check_router_options(residual: str, query: str = "static", weights: str = "softmax", key_norm: bool = True,
                         routing_impl: str = "auto", *, prefix: str = "", error: type[Exception] = InputError) -> None:
    """Raise `error` naming the field (`prefix` + router_query / router_weights / router_key_norm /
    routing_impl) and the allowed values unless the router ablations (method §7) are valid for
    `residual`: any value for a routed variant, only the defaults for one without routers. Ablated
    routers compute with the reference code, so they take routing_impl "auto" or "reference" only."""
    check_choice(query, f"{prefix}router_query", QUERY_KINDS, error=error)
    check_choice(weights, f"{prefix}router_weights", WEIGHT_KINDS, error=error)
    check_bool(key_norm, f"{prefix}router_key_norm", error=error)
    ablated = router_options(query, weights, key_norm)
    if not ablated:
        return
    name, value = next(iter(ablated.items()))
    if not _has_routers(VARIANTS[residual]):
        routed = [n for n, v in VARIANTS.items() if _has_routers(v)]
        raise error(f"{prefix}router_{name}={value!r} is a router ablation and applies only to residual in "
                    f"{routed}; residual={residual!r} has no query routers (leave it {ROUTER_DEFAULTS[name]!r})")
    if routing_impl not in ("auto", "reference"):
        raise error(f"{prefix}routing_impl={routing_impl!r}: routers with router_{name}={value!r} compute with "
                    f"the reference code (the fast paths serve the method's router only); allowed values: "
                    f"'auto', 'reference'")


def stream_options(residual: str, **values) -> dict:
    """The stream variants' options (`STREAM_OPTIONS`: hc_streams, hc_dynamic, hc_sinkhorn_iters) of
    `residual` with None replaced by the papers' defaults; fields that do not apply stay None."""
    return {field: (values.get(field) if values.get(field) is not None else default)
            if residual in applies else values.get(field)
            for field, (applies, default, _) in STREAM_OPTIONS.items()}


def check_stream_options(residual: str, routing_impl: str = "auto", *, prefix: str = "",
                         error: type[Exception] = InputError, **values) -> None:
    """Raise `error` naming the field (`prefix` + name) and the allowed values unless the stream
    options in `values` (hc_streams: a positive integer; hc_dynamic: a bool; hc_sinkhorn_iters: a
    positive integer; None = the default) apply to `residual`, and routing_impl is one the stream
    variants take (`STREAM_IMPLS`)."""
    for field, (applies, _, _) in STREAM_OPTIONS.items():
        value = values.get(field)
        if value is None:
            continue
        if residual not in applies:
            raise error(f"{prefix}{field} applies only to residual in {list(applies)}; leave it None for "
                        f"residual={residual!r} (got {value!r})")
        if field == "hc_dynamic":
            check_bool(value, f"{prefix}{field}", error=error)
        elif not is_int(value) or value < 1:
            raise error(f"{prefix}{field} must be a positive integer (None: the default), got {value!r}")
    if VARIANTS[residual].mode == "streams" and routing_impl not in STREAM_IMPLS:
        raise error(f"{prefix}routing_impl={routing_impl!r}: residual={residual!r} mixes streams, not routed "
                    f"sources; allowed values: {list(STREAM_IMPLS)} ('lean' and 'auto' recompute the stream "
                    f"mixing in backward, 'reference' keeps its activations)")


def _has_routers(variant: Variant) -> bool:
    """Whether the variant's mixers are query routers (`Router`), which the router ablations change."""
    return variant.mode != "none" and issubclass(variant.mixer, Router)


def router_options(query: str = "static", weights: str = "softmax", key_norm: bool = True) -> dict:
    """The mixer options (`DepthMixer` contract) for the router ablations: only the non-default ones,
    so a mixer without ablations is built exactly as before."""
    options = {"query": query, "weights": weights, "key_norm": key_norm}
    return {name: value for name, value in options.items() if value != ROUTER_DEFAULTS[name]}


def source_policy(residual: str, num_layers: int, num_blocks: int | None = None,
                  exact_conversion: str | None = None, dilation: int = 1,
                  period: int = 1, streams: int | None = None) -> SourcePolicy | StatePolicy | StreamPolicy | None:
    """The SourcePolicy (StatePolicy for "states", StreamPolicy with `streams` (None: the default) for
    "streams") of a (valid) variant, None for one without sources."""
    variant = VARIANTS[residual]
    num_sublayers = 2 * num_layers
    if variant.sources == "none":
        return None
    if variant.sources == "states":
        return StatePolicy(num_layers, dilation, period, symbol=variant.symbol)
    if variant.sources == "streams":
        n = stream_options(residual, hc_streams=streams)["hc_streams"]
        return StreamPolicy(num_sublayers, n, symbol=variant.symbol)
    partial = variant.partial_source or exact_conversion == "partial"
    if variant.sources == "sublayers":
        return SourcePolicy(num_sublayers, 1, partial_source=partial, symbol=variant.symbol)
    return SourcePolicy.blocks(num_sublayers, num_blocks, partial_source=partial, symbol=variant.symbol)


def build_residual(residual: str = "standard", *, num_layers: int, hidden_size: int, num_blocks: int | None = None,
                   exact_conversion: str | None = None, eps: float = 1e-6,
                   routing_impl: str = "auto", chunk_size: int | None = None, router_query: str = "static",
                   router_weights: str = "softmax", router_key_norm: bool = True, denseformer_dilation: int = 1,
                   denseformer_period: int = 1, hc_streams: int | None = None, hc_dynamic: bool | None = None,
                   hc_sinkhorn_iters: int | None = None, init_std: float = 0.02) -> ResidualScheme:
    """The ResidualScheme of a variant for a model of `num_layers` layers (2 * num_layers sub-layers,
    attention and MLP alternating) of width `hidden_size` (method §3 and §4).

    standard       no sources, the stream is x_{s+1} = x_s + delta_s
    full_attnres   every sub-layer output,          replace, final router
    block_attnres  block summaries + partial,       replace, final router
    delta_attnres  every sub-layer output,          add
    delta_block    completed block deltas,          add  (+ partial source or gate for exact conversion)
    denseformer    the embedding and layer outputs, average after every `denseformer_period`-th layer over
                   every `denseformer_dilation`-th state (method §7)

    eps: the RMSNorm epsilon of the routers' keys. init_std: the model's weight init std, for mixers
    that draw random weights (mHC's projections). routing_impl: one of `attnres.routing.IMPLS`.
    chunk_size: full_attnres and delta_attnres only: routers per chunk of two-phase routing (None:
    `auto_chunk_size`, round(sqrt(number of routers))); how routing is computed, never what.
    router_query ("static" | "input_dependent"), router_weights ("softmax" | "sigmoid"),
    router_key_norm: the Kimi router ablations (method §7, `Router`), routed variants only.
    hyper_connections  n residual streams (hc_streams, default 4), static or dynamic (hc_dynamic,
                   default True) hyper-connections; mhc: the same with mHC's coefficients and
                   hc_sinkhorn_iters (default 20) Sinkhorn-Knopp rounds (method §7.3)
    Raises InputError naming the argument for an invalid combination. The scheme is the drop-in API
    for a model loop of one's own (docs/how-to/drop-in.md).
    """
    check_residual(residual, num_layers, num_blocks, exact_conversion, dilation=denseformer_dilation,
                   period=denseformer_period)
    check_choice(routing_impl, "routing_impl", IMPLS)
    check_router_options(residual, router_query, router_weights, router_key_norm, routing_impl)
    given = {"hc_streams": hc_streams, "hc_dynamic": hc_dynamic, "hc_sinkhorn_iters": hc_sinkhorn_iters}
    check_stream_options(residual, routing_impl, **given)
    options = router_options(router_query, router_weights, router_key_norm)
    for field, value in stream_options(residual, **given).items():
        option = STREAM_OPTIONS[field][2]
        if option is not None and value is not None:
            options[option] = value
    variant = VARIANTS[residual]
    return ResidualScheme(2 * num_layers, variant.mode,
                          source_policy(residual, num_layers, num_blocks, exact_conversion, denseformer_dilation,
                                        denseformer_period, hc_streams),
                          hidden_size, eps, mixer=variant.mixer, gated=exact_conversion == "gate",
                          impl=routing_impl, chunk_size=chunk_size,
                          mixer_options=options, init_std=init_std)
