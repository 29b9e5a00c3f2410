"""The table of feed-forwards: which FeedForward (attnres.model.sublayer_protocols) each layer's odd
sub-layer is, with its options. The built-in rows are registered here, so the table is complete
wherever it is imported: "dense", the SwiGLU of width `ModelConfig.intermediate_size`
(attnres.model.mlp), and "moe", a mixture of experts (attnres.model.moe) with options `MoEConfig` in
`ModelConfig.moe`, in every layer from `moe.dense_layers` on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnres.common.errors import InputError
from attnres.common.registry import Registry
from attnres.model.mlp import MLP
from attnres.model.moe import MixtureOfExperts
from attnres.model.moe_config import MoEConfig
from attnres.model.sublayer_protocols import FeedForward


@dataclass(frozen=True)
class FeedForwardType:
    """A row of the feed-forward table: `name`; `build`, (config, layer index) -> the FeedForward;
    `options` and `config_field`, its options' class and the ModelConfig field that holds them (None:
    it has none); `check`, (config) -> None or a message saying why the config cannot hold it."""

    name: str
    build: Callable[..., FeedForward]
    options: type | None = None
    config_field: str | None = None
    check: Callable[..., str | None] | None = None

    def __post_init__(self) -> None:
        if not callable(self.build) or not (self.check is None or callable(self.check)):
            raise InputError(f"FeedForwardType {self.name!r}: build and check must be callable")
        if (self.options is None) != (self.config_field is None):
            raise InputError(f"FeedForwardType {self.name!r}: options and config_field go together")


FEED_FORWARDS: Registry[FeedForwardType] = Registry("feed-forward")


def feed_forward_type(config, index: int) -> str:
    """The feed-forward of layer `index` of `config` (a ModelConfig): experts from `moe.dense_layers` on."""
    return "moe" if config.moe is not None and index >= config.moe.dense_layers else "dense"


def build_feed_forward(config, index: int) -> FeedForward:
    """Layer `index`'s feed-forward for `config`, by its row."""
    return FEED_FORWARDS[feed_forward_type(config, index)].build(config, index)


def _dense_layers_fit(config) -> str | None:
    if config.moe.dense_layers > config.num_layers:
        return (f"ModelConfig.moe: dense_layers must be from 0 to num_layers={config.num_layers}, "
                f"got {config.moe.dense_layers}")
    return None


FEED_FORWARDS.register(FeedForwardType("dense", lambda config, index: MLP(config.hidden_size,
                                                                          config.intermediate_size)))
FEED_FORWARDS.register(FeedForwardType("moe", lambda config, index: MixtureOfExperts(config.hidden_size, config.moe),
                                       options=MoEConfig, config_field="moe", check=_dense_layers_fit))

__all__ = ["FEED_FORWARDS", "FeedForward", "FeedForwardType", "build_feed_forward", "feed_forward_type"]
