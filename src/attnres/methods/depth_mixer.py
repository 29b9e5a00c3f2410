"""The depth-mixing protocol: what a residual scheme needs of the module that mixes its sources.

A residual scheme (attnres.residual) owns one mixer per routed sub-layer input, plus a final one
where the variant has it. Each mixer turns the list of sources the scheme hands it into one tensor:

    mixed, weights = mixer(sources, need_weights=True)
    # sources: n tensors (B, T, D); mixed (B, T, D); weights (B, T, n) fp32, or None

A new depth-mixing method subclasses `DepthMixer`, implements `forward` and `reset_parameters`, and
declares what more it can use from the scheme with class attributes:

- `static_query = True`: the mixer scores each source with a query that does not depend on the input
  (method §2), exposes it as `effective_query()` (D,), and its forward accepts `impl=` (a name from
  `attnres.routing.IMPLS`), `inv=` (each source's inverse RMS (B, T), cached by the scheme) and
  `prefix=` (a `RoutedPrefix`: phase-1 routing over its first sources, computed for a whole group of
  mixers at once). The scheme then uses the fast and two-phase paths. Default False: the scheme
  calls `mixer(sources, need_weights=...)` and nothing else. (A property where it depends on the
  mixer's options, as for the Router's ablations.)
- `takes_num_sources = True`: the constructor also takes `num_sources=` n, the number of sources the
  mixer will see (a mixer with one parameter per source, such as DenseFormer's average). Default False.
- `needs_stream = True`: forward also takes `stream=` x_s (B, T, D), the sub-layer's current input
  (the standard residual stream e + sum of earlier outputs), which the scheme then keeps also in
  mode "replace". Default False.
- `takes_init_std = True`: the constructor also takes `init_std=`, the model's weight init standard
  deviation, for a mixer whose initialisation draws random weights (mHC). Default False.
- `mixes_streams = True`: a stream mixer (hyper-connections, mHC; `attnres.methods.stream_mixer`): the
  scheme keeps n residual streams (B, T, n, D) and the mixer reads them into the sub-layer input
  and writes the sub-layer's output back (`StreamMixer`). Default False.

A mixer also states its arithmetic, `flops_per_token(num_sources)` -> `MixerFlops`, which the
FLOPs accounting (`attnres.model.flops`, docs/explanation/scaling-law.md) sums over a model's mixers.

Mixers are built as `Mixer(hidden_size, eps, **options)`: `options` are the variant's options that
declare a mixer keyword (`attnres.methods.options.option(..., mixer=NAME)`, e.g. the Router's
`query`, `weights` and `key_norm`, method §7), always passed, and `gated=True` where the options ask
for a zero-initialised scalar gate on the output (method §4's exact conversion), which a mixer may
refuse with a ValueError.
Every parameter of a mixer is a routing parameter: the optimizer gives them their own group and
conversion from a standard checkpoint leaves them at `reset_parameters()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import torch
from torch import nn


class MixerFlops(NamedTuple):
    """Forward FLOPs per token of one mixer call (2 per multiply-add), split by how they are computed.

    matmul: contractions computed as matrix products (torch's FlopCounterMode counts these);
    vector: contractions computed elementwise (products and sums over sources, which the counter does
    not see). Norms, softmax, sigmoid, tanh, Sinkhorn's divisions and adds of one tensor are not
    counted, as the decoder's norms, activations and residual adds are not.
    """

    matmul: int = 0
    vector: int = 0

    @property
    def total(self) -> int:
        return self.matmul + self.vector


class DepthMixer(nn.Module):
    """Base class of depth-mixing modules; see the module docstring for the contract."""

    static_query: ClassVar[bool] = False
    needs_stream: ClassVar[bool] = False
    takes_num_sources: ClassVar[bool] = False
    mixes_streams: ClassVar[bool] = False
    takes_init_std: ClassVar[bool] = False

    def forward(self, sources: Sequence[torch.Tensor], need_weights: bool = True,
                **fast) -> tuple[torch.Tensor, torch.Tensor | None]:
        """sources: n tensors (B, T, D) -> (mixed (B, T, D), weights (B, T, n) fp32 or None)."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """The initialisation the method prescribes (for routers: zero queries, method §2)."""

    def draw_queries(self, std: float) -> None:
        """Re-draw any static query from N(0, std): the `query_init: normal` ablation. No-op without one."""

    def flops_per_token(self, num_sources: int) -> MixerFlops:
        """Forward FLOPs per token of one call over `num_sources` sources (`MixerFlops`)."""
        raise NotImplementedError(f"{type(self).__name__} does not state its FLOPs (flops_per_token)")
