"""Source policies: which tensors each router may look at (method §3)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SourcePolicy:
    """Sources = the embedding, each completed block's summary, and optionally the current partial.

    Sub-layers are grouped into consecutive blocks of `block_size` (the last may be shorter).
    A block's summary is the sum of its sub-layers' outputs; with `block_size == 1` that is the
    sub-layer's own output delta. `partial_source` adds the running sum of the current block's
    outputs once it is non-empty (Block AttnRes's b_n^j; Delta Block's "partial" conversion).
    `symbol` names completed sources in traces: "d" (per sub-layer delta, d{s}), "b" (block summary,
    b{n}) or "D" (block delta, D{n}); "p" is the partial and "e" the embedding.
    """

    num_sublayers: int
    block_size: int
    partial_source: bool
    symbol: str

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= self.num_sublayers:
            raise ValueError(f"block_size must be in [1, {self.num_sublayers}], got {self.block_size}")
        if self.symbol not in ("d", "b", "D"):
            raise ValueError(f"symbol must be one of ['d', 'b', 'D'], got {self.symbol!r}")

    @classmethod
    def blocks(cls, num_sublayers: int, num_blocks: int, partial_source: bool, symbol: str) -> "SourcePolicy":
        """Policy for `num_blocks` blocks of ceil(num_sublayers / num_blocks) sub-layers."""
        return cls(num_sublayers, math.ceil(num_sublayers / num_blocks), partial_source, symbol)

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.num_sublayers / self.block_size)

    def block_of(self, s: int) -> int:
        """1-based index of the block that sub-layer s belongs to."""
        return s // self.block_size + 1

    def closes_block(self, s: int) -> bool:
        """True when sub-layer s is the last of its block."""
        return (s + 1) % self.block_size == 0 or s == self.num_sublayers - 1

    def source_names(self, s: int) -> list[str]:
        """Names of the sources router s sees, in order, e.g. ['e', 'b1', 'p']."""
        first_in_block = s % self.block_size == 0
        names = ["e"] + [self._completed_name(k) for k in range(1, self.block_of(s))]
        return names + ([] if first_in_block or not self.partial_source else ["p"])

    def final_source_names(self) -> list[str]:
        """Names of the sources a final router sees: the embedding and every block."""
        return ["e"] + [self._completed_name(k) for k in range(1, self.num_blocks + 1)]

    def _completed_name(self, k: int) -> str:
        return f"d{k - 1}" if self.symbol == "d" else f"{self.symbol}{k}"


@dataclass(frozen=True)
class StatePolicy:
    """DenseFormer's sources (method §7): the embedding x_0 and the state x_t after each layer t.

    After layer t (1-based) the residual stream is the layer's output x_t. When t is a multiple of
    `period`, a depth-weighted average over the states x_j with j <= t and j = t (mod `dilation`)
    replaces the stream (Pagliardini et al., 2024: "k x p DenseFormer", k = dilation, p = period);
    x_0 takes part exactly when t is a multiple of the dilation. Mixer m averages after layer
    `mixer_layers[m]`. Names: "e" is the embedding, "x{t}" the state after layer t.
    """

    num_layers: int
    dilation: int = 1
    period: int = 1
    symbol: str = "x"

    def __post_init__(self) -> None:
        for name in ("dilation", "period"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= self.num_layers:
                raise ValueError(f"{name} must be an integer from 1 to num_layers = {self.num_layers}, got {value!r}")

    @property
    def block_size(self) -> int:
        """Sub-layers per completed source: a state completes at every layer's end (two sub-layers)."""
        return 2

    @property
    def mixer_layers(self) -> list[int]:
        """The layers t after which a depth-weighted average replaces the stream, in order."""
        return [t for t in range(1, self.num_layers + 1) if t % self.period == 0]

    def mixer_after(self, t: int) -> int | None:
        """Index of the mixer after layer t, or None when the stream passes on unchanged."""
        return t // self.period - 1 if t % self.period == 0 else None

    def state_indices(self, t: int) -> list[int]:
        """Indices j of the states x_j the average after layer t reads: j <= t, j = t (mod dilation)."""
        return list(range(t % self.dilation, t + 1, self.dilation))

    def source_names(self, m: int) -> list[str]:
        """Names of the sources mixer m sees, e.g. ['e', 'x2', 'x4']."""
        return ["e" if j == 0 else f"{self.symbol}{j}" for j in self.state_indices(self.mixer_layers[m])]


@dataclass(frozen=True)
class StreamPolicy:
    """Hyper-connections' sources (method §7.3): n residual streams h1 .. hn, (B, T, n, D) together.

    Every sub-layer's mixer reads all n streams and writes its output back into them; the final
    collapse reads them too. The streams start as n copies of the embedding.
    """

    num_sublayers: int
    num_streams: int = 4
    symbol: str = "h"

    def __post_init__(self) -> None:
        if not isinstance(self.num_streams, int) or isinstance(self.num_streams, bool) or self.num_streams < 1:
            raise ValueError(f"num_streams must be a positive integer, got {self.num_streams!r}")

    def source_names(self, s: int) -> list[str]:
        """Names of the streams mixer s reads (the same for every mixer), e.g. ['h1', 'h2', 'h3', 'h4']."""
        return [f"{self.symbol}{k}" for k in range(1, self.num_streams + 1)]
