"""Which sources each router sees, for every variant, as literal tables written from method §3.

The model runs with its real residual loop; its sub-layers are replaced by stubs whose outputs
are distinct unit vectors (sub-layer s outputs unit vector s + 1, the embedding is unit vector 0),
so every tensor a router receives can be decoded back into the outputs it sums. A source that
sums the wrong outputs (e.g. `e + D2` instead of `D2`, the public code's bookkeeping bug) decodes
to no name and fails.

Symbols: e = embedding, d3 = output of sub-layer 3, b2 = summary of block 2 (Block AttnRes),
D2 = delta of block 2 (Delta Block), p = partial sum of the current block so far.
"""

import math

import pytest
import torch
from torch import nn

from attnres import AttnResLM, ModelConfig

# Blocks written out from method §3.2: N blocks of ceil(2L / N) sub-layers, the last one shorter.
BLOCKS = {
    (6, 1): [range(0, 12)],
    (6, 2): [range(0, 6), range(6, 12)],
    (6, 3): [range(0, 4), range(4, 8), range(8, 12)],
    (6, 4): [range(0, 3), range(3, 6), range(6, 9), range(9, 12)],
    (6, 12): [range(s, s + 1) for s in range(12)],
    (5, 4): [range(0, 3), range(3, 6), range(6, 9), range(9, 10)],
}

EXPECTED = {
    ("full_attnres", 6, None, None): """
        s0:    e
        s1:    e d0
        s2:    e d0 d1
        s3:    e d0 d1 d2
        s4:    e d0 d1 d2 d3
        s5:    e d0 d1 d2 d3 d4
        s6:    e d0 d1 d2 d3 d4 d5
        s7:    e d0 d1 d2 d3 d4 d5 d6
        s8:    e d0 d1 d2 d3 d4 d5 d6 d7
        s9:    e d0 d1 d2 d3 d4 d5 d6 d7 d8
        s10:   e d0 d1 d2 d3 d4 d5 d6 d7 d8 d9
        s11:   e d0 d1 d2 d3 d4 d5 d6 d7 d8 d9 d10
        final: e d0 d1 d2 d3 d4 d5 d6 d7 d8 d9 d10 d11
    """,
    ("delta_attnres", 6, None, None): """
        s0:    e
        s1:    e d0
        s2:    e d0 d1
        s3:    e d0 d1 d2
        s4:    e d0 d1 d2 d3
        s5:    e d0 d1 d2 d3 d4
        s6:    e d0 d1 d2 d3 d4 d5
        s7:    e d0 d1 d2 d3 d4 d5 d6
        s8:    e d0 d1 d2 d3 d4 d5 d6 d7
        s9:    e d0 d1 d2 d3 d4 d5 d6 d7 d8
        s10:   e d0 d1 d2 d3 d4 d5 d6 d7 d8 d9
        s11:   e d0 d1 d2 d3 d4 d5 d6 d7 d8 d9 d10
    """,
    ("block_attnres", 6, 1, None): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e p
        s4:    e p
        s5:    e p
        s6:    e p
        s7:    e p
        s8:    e p
        s9:    e p
        s10:   e p
        s11:   e p
        final: e b1
    """,
    ("block_attnres", 6, 2, None): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e p
        s4:    e p
        s5:    e p
        s6:    e b1
        s7:    e b1 p
        s8:    e b1 p
        s9:    e b1 p
        s10:   e b1 p
        s11:   e b1 p
        final: e b1 b2
    """,
    ("block_attnres", 6, 3, None): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e p
        s4:    e b1
        s5:    e b1 p
        s6:    e b1 p
        s7:    e b1 p
        s8:    e b1 b2
        s9:    e b1 b2 p
        s10:   e b1 b2 p
        s11:   e b1 b2 p
        final: e b1 b2 b3
    """,
    ("block_attnres", 6, 4, None): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e b1
        s4:    e b1 p
        s5:    e b1 p
        s6:    e b1 b2
        s7:    e b1 b2 p
        s8:    e b1 b2 p
        s9:    e b1 b2 b3
        s10:   e b1 b2 b3 p
        s11:   e b1 b2 b3 p
        final: e b1 b2 b3 b4
    """,
    ("block_attnres", 6, 12, None): """
        s0:    e
        s1:    e b1
        s2:    e b1 b2
        s3:    e b1 b2 b3
        s4:    e b1 b2 b3 b4
        s5:    e b1 b2 b3 b4 b5
        s6:    e b1 b2 b3 b4 b5 b6
        s7:    e b1 b2 b3 b4 b5 b6 b7
        s8:    e b1 b2 b3 b4 b5 b6 b7 b8
        s9:    e b1 b2 b3 b4 b5 b6 b7 b8 b9
        s10:   e b1 b2 b3 b4 b5 b6 b7 b8 b9 b10
        s11:   e b1 b2 b3 b4 b5 b6 b7 b8 b9 b10 b11
        final: e b1 b2 b3 b4 b5 b6 b7 b8 b9 b10 b11 b12
    """,
    ("delta_block", 6, 1, None): """
        s0:    e
        s1:    e
        s2:    e
        s3:    e
        s4:    e
        s5:    e
        s6:    e
        s7:    e
        s8:    e
        s9:    e
        s10:   e
        s11:   e
    """,
    ("delta_block", 6, 2, None): """
        s0:    e
        s1:    e
        s2:    e
        s3:    e
        s4:    e
        s5:    e
        s6:    e D1
        s7:    e D1
        s8:    e D1
        s9:    e D1
        s10:   e D1
        s11:   e D1
    """,
    ("delta_block", 6, 3, None): """
        s0:    e
        s1:    e
        s2:    e
        s3:    e
        s4:    e D1
        s5:    e D1
        s6:    e D1
        s7:    e D1
        s8:    e D1 D2
        s9:    e D1 D2
        s10:   e D1 D2
        s11:   e D1 D2
    """,
    ("delta_block", 6, 4, None): """
        s0:    e
        s1:    e
        s2:    e
        s3:    e D1
        s4:    e D1
        s5:    e D1
        s6:    e D1 D2
        s7:    e D1 D2
        s8:    e D1 D2
        s9:    e D1 D2 D3
        s10:   e D1 D2 D3
        s11:   e D1 D2 D3
    """,
    ("delta_block", 6, 12, None): """
        s0:    e
        s1:    e D1
        s2:    e D1 D2
        s3:    e D1 D2 D3
        s4:    e D1 D2 D3 D4
        s5:    e D1 D2 D3 D4 D5
        s6:    e D1 D2 D3 D4 D5 D6
        s7:    e D1 D2 D3 D4 D5 D6 D7
        s8:    e D1 D2 D3 D4 D5 D6 D7 D8
        s9:    e D1 D2 D3 D4 D5 D6 D7 D8 D9
        s10:   e D1 D2 D3 D4 D5 D6 D7 D8 D9 D10
        s11:   e D1 D2 D3 D4 D5 D6 D7 D8 D9 D10 D11
    """,
    ("delta_block", 6, 2, 'partial'): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e p
        s4:    e p
        s5:    e p
        s6:    e D1
        s7:    e D1 p
        s8:    e D1 p
        s9:    e D1 p
        s10:   e D1 p
        s11:   e D1 p
    """,
    ("delta_block", 6, 4, 'partial'): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e D1
        s4:    e D1 p
        s5:    e D1 p
        s6:    e D1 D2
        s7:    e D1 D2 p
        s8:    e D1 D2 p
        s9:    e D1 D2 D3
        s10:   e D1 D2 D3 p
        s11:   e D1 D2 D3 p
    """,
    ("block_attnres", 5, 4, None): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e b1
        s4:    e b1 p
        s5:    e b1 p
        s6:    e b1 b2
        s7:    e b1 b2 p
        s8:    e b1 b2 p
        s9:    e b1 b2 b3
        final: e b1 b2 b3 b4
    """,
    ("delta_block", 5, 4, None): """
        s0:    e
        s1:    e
        s2:    e
        s3:    e D1
        s4:    e D1
        s5:    e D1
        s6:    e D1 D2
        s7:    e D1 D2
        s8:    e D1 D2
        s9:    e D1 D2 D3
    """,
    ("delta_block", 5, 4, 'partial'): """
        s0:    e
        s1:    e p
        s2:    e p
        s3:    e D1
        s4:    e D1 p
        s5:    e D1 p
        s6:    e D1 D2
        s7:    e D1 D2 p
        s8:    e D1 D2 p
        s9:    e D1 D2 D3
    """,
}

class UnitOutput(nn.Module):
    """A stub sub-layer whose output is unit vector `index` at every position."""

    def __init__(self, index: int, dim: int) -> None:
        super().__init__()
        self.index, self.dim = index, dim

    def forward(self, x, *unused):
        out = torch.zeros(*x.shape[:-1], self.dim, dtype=x.dtype)
        out[..., self.index] = 1.0
        return out


def decode(source: torch.Tensor, blocks, s: int, per_sublayer: bool, symbol: str) -> str:
    """Name the sum of unit vectors in `source` (any token): e, d{i}, {symbol}{k} or p."""
    vec = source[0, 0]
    assert torch.all((vec == 0) | (vec == 1)), f"source is not a 0/1 sum of outputs: {vec.tolist()}"
    units = set(torch.nonzero(vec).flatten().tolist())
    if units == {0}:
        return "e"
    outputs = {u - 1 for u in units}
    if 0 in units:
        return f"e+{sorted(outputs)}"  # the embedding mixed into a delta: always wrong
    if per_sublayer and len(outputs) == 1:
        return f"d{outputs.pop()}"
    for k, block in enumerate(blocks, start=1):
        if outputs == set(block):
            return f"{symbol}{k}"
    current = next(block for block in blocks if s in block)
    if outputs == set(range(current.start, s)):
        return "p"
    return f"?{sorted(outputs)}"


def run_trace(residual: str, num_layers: int, num_blocks, exact):
    options = {name: value for name, value in (("num_blocks", num_blocks), ("exact_conversion", exact))
               if value is not None}
    config = ModelConfig(vocab_size=4, hidden_size=16, num_layers=num_layers, num_heads=2,
                         num_kv_heads=1, intermediate_size=8, residual=residual, residual_options=options,
                         norm_eps=1e-6)
    model = AttnResLM(config).set_routing("reference")  # calls each Router; fast paths are tested equal to it
    dim = config.hidden_size
    with torch.no_grad():
        model.embed_tokens.weight.zero_()
        model.embed_tokens.weight[0, 0] = 1.0
    for i, layer in enumerate(model.layers):
        layer.self_attn = UnitOutput(2 * i + 1, dim)
        layer.mlp = UnitOutput(2 * i + 2, dim)
    seen = []
    for router in model.routers:
        original = router.forward
        router.forward = lambda sources, original=original, **kw: (seen.append(list(sources)), original(sources, **kw))[1]
    model(torch.zeros(1, 3, dtype=torch.long))
    return model, seen


def parse(table: str) -> list[list[str]]:
    return [line.split(":", 1)[1].split() for line in table.strip().splitlines()]


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-L{k[1]}-N{k[2]}-{k[3]}")
def test_router_sources_match_method(key):
    residual, num_layers, num_blocks, exact = key
    expected = parse(EXPECTED[key])
    model, seen = run_trace(residual, num_layers, num_blocks, exact)
    per_sublayer = residual in ("full_attnres", "delta_attnres")
    blocks = [range(s, s + 1) for s in range(2 * num_layers)] if per_sublayer else BLOCKS[(num_layers, num_blocks)]
    symbol = {"block_attnres": "b", "delta_block": "D"}.get(residual, "d")
    decoded = [[decode(src, blocks, min(s, 2 * num_layers - 1), per_sublayer, symbol) for src in sources]
               for s, sources in enumerate(seen)]
    assert decoded == expected
    # The names the library reports for analysis agree with what its routers actually received.
    assert model.residual.source_names() == expected


def test_block_table_is_the_ceil_rule():
    """The literal block table above is method's S = ceil(2L / N) rule (guards the test itself)."""
    for (num_layers, n), blocks in BLOCKS.items():
        size = math.ceil(2 * num_layers / n)
        assert [list(b) for b in blocks] == [list(range(a, min(a + size, 2 * num_layers)))
                                             for a in range(0, 2 * num_layers, size)]


def test_standard_has_no_routers():
    model, seen = run_trace("standard", 6, None, None)
    assert len(model.routers) == 0 and seen == [] and model.residual.source_names() == []
