"""The variant table: every `residual` value as a source policy, a routing mode and a depth mixer.

A method's file in this package holds its mixer, its options and its rows (`register_variant`);
configs, the model, training, comparison, analysis, benchmarks and the Hugging Face classes read the
table by name (docs/how-to/add-a-method.md). The residual loop (attnres.residual) builds a row's scheme.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnres.common.checks import check_choice
from attnres.common.errors import InputError
from attnres.common.registry import Registry
from attnres.methods.depth_mixer import DepthMixer
from attnres.methods.options import VariantOptions
from attnres.methods.router import Router
from attnres.routing.route import IMPLS

# How a sub-layer's input is formed (`attnres.residual.ResidualScheme`, one scheme class per mode).
MODES = ("none", "replace", "add", "average", "streams")
SOURCE_KINDS = ("none", "sublayers", "blocks", "states", "streams")


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
    options:  the variant's options dataclass (`attnres.methods.options.VariantOptions`).
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


register_variant(Variant("standard", "none", method="method §1", color="#4d4d4d"))  # dark grey: the neutral reference
