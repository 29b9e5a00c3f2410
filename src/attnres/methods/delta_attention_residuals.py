"""Delta Attention Residuals (method §3.3, §3.4): the routed mixture of sub-layer changes (or block
deltas) is added to the standard stream; the exact conversion of a standard model (method §4); their
options and rows of the variant table."""

from __future__ import annotations

from dataclasses import dataclass

from attnres.methods.attention_residuals import BlockOptions
from attnres.methods.options import option
from attnres.methods.router import RouterOptions
from attnres.methods.variant import Variant, register_variant

# What each exact_conversion value (method §4) changes: a zero-initialised gate on every mixer, or
# the current block's partial sum as one more source (then the sources sum to x_s).
EXACT_CONVERSIONS = ("gate", "partial")


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


register_variant(Variant("delta_attnres", "add", "sublayers", "d", options=RouterOptions, method="method §3.3",
                         color="#2ca02c"))
register_variant(Variant("delta_block", "add", "blocks", "D", options=DeltaBlockOptions, method="method §3.4",
                         color="#d62728"))
