"""Building a variant's residual scheme from its row of the variant table (attnres.methods): its
options resolved and checked for a model's depth, its source policy, the routing implementations
that compute it, and its display name."""

from __future__ import annotations

import torch

from attnres.common.checks import check_choice, check_int, check_positive_number
from attnres.common.errors import InputError
from attnres.methods import VARIANTS, VariantOptions
from attnres.residual.averaging import AveragingScheme
from attnres.residual.policy import SourcePolicy, StatePolicy, StreamPolicy
from attnres.residual.routed import RoutedScheme
from attnres.residual.scheme import ResidualScheme, StandardScheme
from attnres.residual.stream_scheme import StreamScheme
from attnres.routing import IMPLS

# The scheme class of each routing mode but the routed ones ("replace", "add": `RoutedScheme`).
SCHEMES = {"none": StandardScheme, "average": AveragingScheme, "streams": StreamScheme}


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
