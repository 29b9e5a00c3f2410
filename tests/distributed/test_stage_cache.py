"""Single-process checks of the cross-stage cache, its gradient mailbox and the byte counter; and of
the stages chained by hand (no process group) against the unsplit model."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from attnres.distributed.pipeline_layout import PipelineConfig, build_layout
from attnres.distributed.pipeline_stage import StageModule
from attnres.distributed.stage_cache import ByteCounter, SourceCache
from attnres.model.model_config import ModelConfig
from attnres.model.decoder import AttnResLM, next_token_loss
from tests.helpers import activate_routing, options_of


def test_later_stage_gradient_reaches_the_owner_through_the_tap():
    cache = SourceCache()
    source = torch.randn(2, 3, requires_grad=True)
    owned = cache.keep(0, 0, source * 1.0)  # the owning stage uses the tapped tensor from here on
    (copy_,) = cache.lookup(0, 1)
    assert copy_.grad_fn is not None and not copy_.is_leaf
    (3.0 * copy_).sum().backward()          # the later stage's backward runs first...
    assert source.grad is None              # ...and does not run into the owner's graph
    (2.0 * owned).sum().backward()          # the owner's backward adds the mailed gradient
    torch.testing.assert_close(source.grad, torch.full((2, 3), 5.0))
    cache.reset()                           # nothing left in the mailbox


def test_two_later_uses_accumulate_and_a_lost_gradient_is_reported():
    cache = SourceCache()
    source = torch.randn(4, requires_grad=True)
    owned = cache.keep(1, 2, source + 0.0)
    with pytest.raises(RuntimeError, match="never kept"):
        cache.lookup(1, 3)                  # sources 0 and 1 were never kept
    cache.keep(1, 0, torch.zeros(4))
    cache.keep(1, 1, torch.zeros(4))
    for scale in (1.0, 2.0):
        (scale * cache.lookup(1, 3)[2]).sum().backward()
    owned.sum().backward()
    torch.testing.assert_close(source.grad, torch.full((4,), 4.0))
    (cache.lookup(1, 3)[2]).sum().backward()  # deposited, but the owner's backward already ran
    with pytest.raises(RuntimeError, match=r"\(1, 2\)"):
        cache.reset()


def test_release_drops_one_microbatch():
    cache = SourceCache()
    for mb in (0, 1):
        cache.keep(mb, 0, torch.zeros(1))
    cache.release(0)
    assert len(cache) == 1
    cache.lookup(1, 1)
    with pytest.raises(RuntimeError, match="micro-batch 0"):
        cache.lookup(0, 1)


def test_byte_counter_counts_tensors_by_direction_and_edge():
    counter = ByteCounter(num_edges=2)
    ops = [SimpleNamespace(tensor=torch.zeros(2, 3)), SimpleNamespace(tensor=torch.zeros(4, dtype=torch.float16))]
    counter.record("forward", 1, ops, saved=10)
    counter.record("backward", 0, ops[:1], saved=0)
    totals = counter.totals()  # no process group: this rank's own counts
    assert totals.forward_per_edge == (0, 24 + 8) and totals.backward_per_edge == (24, 0)
    assert (totals.forward_sent, totals.forward_uncached, totals.backward_uncached) == (32, 42, 24)
    counter.reset()
    assert counter.totals().forward_sent == 0


VARIANTS = [("standard", None, False), ("full_attnres", None, False), ("block_attnres", 2, True),
            ("delta_attnres", None, False), ("delta_block", 2, True)]


@pytest.mark.parametrize("residual,num_blocks,partial", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_stages_chained_by_hand_match_the_unsplit_model(residual, num_blocks, partial, cache):
    """4 one-layer stages on 2 simulated ranks, GPipe order (all forwards, then all backwards).
    The block variants have blocks of two layers, so stage boundaries cut blocks and partial sums
    travel (delta_block also routes over its partial: exact_conversion="partial")."""
    config = ModelConfig(vocab_size=32, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1,
                         intermediate_size=24, residual=residual, max_seq_len=6,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion="partial"
                                                     if residual == "delta_block" else None))
    torch.manual_seed(0)
    model = AttnResLM(config)
    activate_routing(model.routers)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(1))
    reference(ids, labels=ids).loss.backward()

    pipeline = PipelineConfig(schedule="interleaved1f1b", stages_per_rank=2, num_microbatches=2,
                              microbatch_size=2, seq_len=6, allow_partial_blocks=partial, cache=cache)
    layout = build_layout(config, pipeline, num_ranks=2)
    caches = [SourceCache(), SourceCache()] if cache else [None, None]
    stages = [StageModule(model, layout, j, caches[layout.rank_of(j)]) for j in range(layout.num_stages)]
    records = []
    for mb, rows in enumerate(ids.split(2)):
        received, trace = (rows,), []
        for stage in stages:
            stage.microbatch = mb
            leaves = received if stage.is_first else tuple(t.detach().requires_grad_() for t in received)
            out = stage(*leaves)
            trace.append((leaves, out))
            received = out if isinstance(out, tuple) else (out,)
        records.append((trace, next_token_loss(out, rows) / 2))
    for trace, loss in records:
        grads = None
        for j in reversed(range(len(stages))):
            leaves, out = trace[j]
            torch.autograd.backward(loss if grads is None else out, grads)
            grads = tuple(leaf.grad for leaf in leaves) if j else None
    for cache_ in caches:
        if cache_ is not None:
            cache_.reset()  # every mailed gradient was collected
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
