"""attnres.model.flops: training FLOPs per token, checked against torch's FlopCounterMode.

The counter sees matrix products (mm, bmm; attention too under the math kernel). It does not see
elementwise work: the routers' scores and weighted sums, DenseFormer's average, a_post * delta of
the stream mixers. So the whole-model test compares what it sees (`counted_by_torch`) exactly, and
the elementwise contractions are checked against the counter on the same contractions written as
einsums, on the mixers' own shapes.
"""

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnres.model import AttnResLM, ModelConfig
from attnres.model.flops import TRAINING_MULTIPLIER, flops_per_token, training_flops
from attnres.methods import DepthWeightedAverage, HyperConnection, MixerFlops, Router
from attnres.train.run_config import load_run_config
from tests.helpers import options_of

D, L, T = 32, 4, 48
PAPER_7B = Path(__file__).resolve().parents[2] / "configs" / "paper" / "qwen3-7.6b.yaml"
VARIANTS = [
    {"residual": "standard"},
    {"residual": "full_attnres"},
    {"residual": "full_attnres", "query": "input_dependent"},
    {"residual": "full_attnres", "weights": "sigmoid", "key_norm": False},
    {"residual": "block_attnres", "num_blocks": 4},
    {"residual": "delta_attnres"},
    {"residual": "delta_block", "num_blocks": 4},
    {"residual": "delta_block", "num_blocks": 4, "exact_conversion": "gate"},
    {"residual": "denseformer"},
    {"residual": "hyper_connections"},
    {"residual": "hyper_connections", "dynamic": False},
    {"residual": "mhc"},
]


def config(residual="standard", **options):
    """The model of variant `residual` with `options` (its residual_options; None: not given)."""
    return ModelConfig(vocab_size=256, hidden_size=D, num_layers=L, num_heads=4, num_kv_heads=2,
                       intermediate_size=64, max_seq_len=64, residual=residual, residual_options=options_of(**options))


def counted_routing_impl(cfg):
    """The routing path the accounting describes, on every machine: the routers' elementwise
    reference (what "auto" gives with the fused C++ kernel, which the counter does not see into
    either; without it "auto" takes the lean op, whose batched products the counter does see), and
    for the stream mixers "auto" (their lean path, taken whether or not the kernel is built)."""
    return "auto" if cfg.residual in ("hyper_connections", "mhc") else "reference"


def counted_training_flops(cfg, seq_len):
    """FlopCounterMode's total for one forward and backward of a (2, seq_len) batch, per token,
    routed as `counted_routing_impl` says."""
    model = AttnResLM(cfg).set_routing(counted_routing_impl(cfg))
    tokens = torch.randint(0, cfg.vocab_size, (2, seq_len), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).logits.float().sum().backward()
    return counter.get_total_flops() / tokens.numel()


@pytest.mark.parametrize("fields", VARIANTS, ids=lambda f: "-".join(map(str, f.values())))
def test_what_the_counter_sees_matches_exactly(fields):
    cfg = config(**fields)
    flops = flops_per_token(cfg, T)
    assert counted_training_flops(cfg, T) == TRAINING_MULTIPLIER * flops.counted_by_torch


def test_standard_is_six_n_plus_the_attention_term():
    cfg = config()
    model = AttnResLM(cfg)
    matmul_params = sum(p.numel() for name, p in model.named_parameters()
                        if name.endswith("proj.weight")) + cfg.vocab_size * D  # tied head
    flops = flops_per_token(cfg, T)
    assert flops.mixing == 0
    assert flops.training == 6 * matmul_params + 12 * L * T * cfg.num_heads * cfg.head_dim


def test_routing_sums_over_every_router_and_its_sources():
    # Full AttnRes: router s sees s + 1 sources, the final one 2L + 1: 4 D (2L + 1)(L + 1) in all.
    assert flops_per_token(config(residual="full_attnres"), T).mixing_vector == 4 * D * (2 * L + 1) * (L + 1)
    # Delta AttnRes: no final router: 4 D L (2L + 1).
    assert flops_per_token(config(residual="delta_attnres"), T).mixing_vector == 4 * D * L * (2 * L + 1)
    # Blocks see fewer sources than per-sub-layer routing, and the attention term grows with T.
    full, block = (flops_per_token(config(residual=r, num_blocks=n), T).mixing
                   for r, n in (("full_attnres", None), ("block_attnres", 2)))
    assert block < full
    assert flops_per_token(config(), 2 * T).attention == 2 * flops_per_token(config(), T).attention


def matmul_flops(*shape_pairs):
    """FlopCounterMode's count of torch.matmul over pairs of operand shapes, for one token."""
    with FlopCounterMode(display=False) as counter:
        for a, b in shape_pairs:
            torch.matmul(torch.ones(a), torch.ones(b))
    return counter.get_total_flops()


@pytest.mark.parametrize("n", [1, 3, 9])
def test_elementwise_contractions_match_the_counter_written_as_matrix_products(n):
    # Router: scores z (n) = K (n, D) q (D, 1); mixed (1, D) = alpha (1, n) V (n, D).
    assert Router(D).flops_per_token(n).vector == matmul_flops(((n, D), (D, 1)), ((1, n), (n, D)))
    # DenseFormer: alpha (1, n) X (n, D).
    assert DepthWeightedAverage(D, num_sources=n).flops_per_token(n).vector == matmul_flops(((1, n), (n, D)))
    # Stream mixers: a_post (n, 1) times delta (1, D), an outer product.
    assert HyperConnection(D, num_streams=n).flops_per_token(n).vector == matmul_flops(((1, n, 1), (1, 1, D)))


def test_stream_matrix_products_as_the_lean_path_computes_them():
    n = 4
    mixer = HyperConnection(D, num_streams=n)
    streams = torch.randn(1, 1, n, D)
    with FlopCounterMode(display=False) as counter:
        written = []
        h, _ = mixer(streams, need_weights=False, written=written)
        mixer.write(streams, torch.randn(1, 1, D), written[0])
    assert counter.get_total_flops() == mixer.flops_per_token(n).matmul


def test_paper_sizes_count_without_memory_and_training_flops_scale_with_tokens():
    cfg = load_run_config(PAPER_7B).model.with_vocab_size(151_669)
    flops = flops_per_token(cfg)  # built on the meta device: seconds, no 30 GB of weights
    assert flops.training > 6 * 7e9
    assert training_flops(cfg, 1000) == 1000 * flops.training
    assert isinstance(MixerFlops(1, 2).total, int) and MixerFlops(1, 2).total == 3


@pytest.mark.parametrize("seq_len", [0, -1, 1.5, True])
def test_bad_seq_len_is_refused_by_name(seq_len):
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        flops_per_token(config(), seq_len)
