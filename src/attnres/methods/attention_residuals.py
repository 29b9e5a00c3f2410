"""Attention Residuals (method §3.1, §3.2): every sub-layer input is a softmax mixture of the embedding
and the earlier sub-layer outputs (`full_attnres`) or of block summaries (`block_attnres`), mixed by
the Router (attnres.methods.router); their options and rows of the variant table."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnres.common.errors import InputError
from attnres.methods.options import REQUIRED, VariantOptions, option
from attnres.methods.router import RouterOptions
from attnres.methods.variant import Variant, register_variant


def valid_num_blocks(num_sublayers: int) -> list[int]:
    """Block counts N that split `num_sublayers` into exactly N blocks of size ceil(2L / N).

    method §3.2: blocks hold S = ceil(2L / N) sub-layers, the last one possibly shorter; an N for
    which that gives fewer than N blocks (2L = 12, N = 5 -> S = 3, 4 blocks) is not valid.
    """
    return [n for n in range(1, num_sublayers + 1) if math.ceil(num_sublayers / math.ceil(num_sublayers / n)) == n]


def nearest_num_blocks(num_sublayers: int, requested: int) -> int:
    """The valid block count (`valid_num_blocks`) nearest `requested`; on a tie the smaller."""
    return min(valid_num_blocks(num_sublayers), key=lambda n: (abs(n - requested), n))


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


register_variant(Variant("full_attnres", "replace", "sublayers", "d", options=RouterOptions, method="method §3.1",
                         color="#1f77b4"))
register_variant(Variant("block_attnres", "replace", "blocks", "b", partial_source=True, options=BlockOptions,
                         method="method §3.2", color="#ff7f0e"))
