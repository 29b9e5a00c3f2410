"""The five residual variants as (source policy, routing mode) pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnres.residual.policy import SourcePolicy
from attnres.residual.scheme import ResidualScheme

if TYPE_CHECKING:  # the model imports this package, never the reverse
    from attnres.model.config import ModelConfig


def build_residual(config: "ModelConfig") -> ResidualScheme:
    """The ResidualScheme for `config.residual` (METHOD §3 and §4).

    standard       no sources, the stream is x_{s+1} = x_s + delta_s
    full_attnres   every sub-layer output,          replace, final router
    block_attnres  block summaries + partial,       replace, final router
    delta_attnres  every sub-layer output,          add
    delta_block    completed block deltas,          add  (+ partial source or gate for exact conversion)
    """
    n = config.num_sublayers
    gated = False
    if config.residual == "standard":
        mode, policy = "none", None
    elif config.residual == "full_attnres":
        mode, policy = "replace", SourcePolicy(n, 1, partial_source=False, symbol="d")
    elif config.residual == "block_attnres":
        mode, policy = "replace", SourcePolicy.blocks(n, config.num_blocks, partial_source=True, symbol="b")
    elif config.residual == "delta_attnres":
        mode, policy = "add", SourcePolicy(n, 1, partial_source=False, symbol="d")
    elif config.residual == "delta_block":
        partial = config.exact_conversion == "partial"
        gated = config.exact_conversion == "gate"
        mode, policy = "add", SourcePolicy.blocks(n, config.num_blocks, partial_source=partial, symbol="D")
    else:  # ModelConfig validates residual; this guards a new name added there but not here.
        raise ValueError(f"no residual scheme for residual={config.residual!r}")
    return ResidualScheme(n, mode, policy, config.hidden_size, config.norm_eps, gated=gated,
                          impl=config.routing_impl)
