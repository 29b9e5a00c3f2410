"""Pipeline parallelism on 2 gloo processes: same loss and gradients as the unsplit model, and the
cross-stage cache sends exactly the bytes the block layout predicts (method §5)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnres.distributed.pipeline import build_pipeline
from attnres.distributed.pipeline_layout import PipelineConfig
from attnres.model.model_config import ModelConfig
from attnres.model.decoder import AttnResLM
from tests.distributed.spawn import run_workers
from tests.helpers import activate_routing, options_of

# fp32 throughout; the pipeline only re-batches the same operations (micro-batches of 2 rows
# instead of 4), so losses and gradients agree to rounding. Gradients summed over 16 sub-layers
# round further apart where routing runs as the lean op (routing_impl "auto" without the fused
# kernel: its batched products sum in an order that depends on the batch), a few 1e-6 on the
# embedding; a wrong or missing source is off by orders of magnitude more (`activate_routing`).
RTOL, ATOL = 1e-5, 1e-6
GRAD_ATOL = 2e-5
MICROBATCHES, MICROBATCH_SIZE, SEQ_LEN, HIDDEN = 2, 2, 8, 16

# Expected tensors per micro-batch crossing each transition k -> k+1 (the first sub-layer of stage
# k+1 is b; 4 layers = 8 sub-layers; P = 2 ranks; stage j runs on rank j % P):
#     tensors(k) = [stream] + [partial if b % S] + n(b) - cached(k)
#     n(b) = 1 + b // S completed sources (embedding + closed blocks of S sub-layers; 0 for standard)
#     cached(k) = n(end of stage k+1-P) with the cache and k+1 >= P (what the receiving rank already
#                 holds for this micro-batch), else 0.
# method §5: the largest per-transition payload shrinks V-fold with V virtual stages per rank; with
# V = 1 nothing is cached. The comments give the arithmetic; the numbers are written out so the
# check does not reuse the library's layout code.


@dataclass(frozen=True)
class Case:
    residual: str
    num_blocks: int | None
    schedule: str
    stages_per_rank: int
    uncached: list[int]          # tensors per micro-batch crossing each transition, without the cache
    cached: list[int]            # the same with the cache
    allow_partial: bool = False
    tie: bool = False
    num_layers: int = 4
    v_fold: bool = False         # the largest transition shrinks exactly V-fold (one block per stage)
    query: str | None = None     # "input_dependent": the query reads the stream, which then travels


CASES = [
    # S=2, b=2,4,6: n=2,3,4; cached(1)=n(2)=2, cached(2)=n(4)=3 (peak 4 -> 2: V=2-fold)
    Case("block_attnres", 4, "interleaved1f1b", 2, [2, 3, 4], [2, 1, 1], v_fold=True),
    # S=4, b=2,4,6: stream + partial(b=2,6) + n=1,2,2; cached(1)=n(2)=1, cached(2)=n(4)=2
    Case("delta_block", 2, "interleaved1f1b", 2, [3, 3, 4], [3, 2, 2], allow_partial=True),
    # S=1, b=2,4,6: stream + n=3,5,7; cached(1)=n(2)=3, cached(2)=n(4)=5 (peak 8 -> 4: V=2-fold)
    Case("delta_attnres", None, "interleaved1f1b", 2, [4, 6, 8], [4, 3, 3], v_fold=True),
    # the stream only; embedding and head share a weight whose two halves live on different ranks
    Case("standard", None, "interleaved1f1b", 2, [1, 1, 1], [1, 1, 1], tie=True),
    # V = 1: b=4 only; nothing is on the receiving rank yet, the cache saves nothing
    Case("block_attnres", 2, "gpipe", 1, [2], [2]),           # S=4: n(4)=2, no stream
    Case("full_attnres", None, "1f1b", 1, [5], [5]),           # S=1: n(4)=5, no stream
    Case("delta_block", 2, "1f1b", 1, [3], [3]),               # S=4: stream + n(4)=2
    # an input-dependent query reads x_s, so "replace" mode sends the stream too: stream + n(4)=5
    Case("full_attnres", None, "1f1b", 1, [6], [6], query="input_dependent"),
    # DenseFormer: stream + states x_0 .. x_{b/2}: n(b) = 1 + b/2 = 2, 3, 4; cached(1) = n(2) = 2,
    # cached(2) = n(4) = 3
    Case("denseformer", None, "interleaved1f1b", 2, [3, 4, 5], [3, 2, 2]),
]
# 4 ranks x 2 virtual stages, 8 layers (16 sub-layers), S=2: b=2,4,...,14, n(b)=1+b/2=2..8;
# transitions k>=3 land on a rank whose stage k-3 ended at b=2(k-2): cached = n = k-1, so each
# sends n(2k+2) - (k-1) = 3 (peak 8 -> 4: V=2-fold).
FOUR_RANKS = Case("block_attnres", 8, "interleaved1f1b", 2, [2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 3, 3, 3, 3],
                  num_layers=8, v_fold=True)


def _model(case: Case) -> AttnResLM:
    config = ModelConfig(vocab_size=48, hidden_size=HIDDEN, num_layers=case.num_layers, num_heads=2, num_kv_heads=1,
                         intermediate_size=24, residual=case.residual,
                         residual_options=options_of(num_blocks=case.num_blocks, query=case.query),
                         tie_embeddings=case.tie, max_seq_len=SEQ_LEN)
    torch.manual_seed(0)
    model = AttnResLM(config)
    activate_routing(model.routers)  # non-uniform routing, so a wrong or missing source shows
    return model


def _reference(model: AttnResLM, input_ids, labels) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = copy.deepcopy(model)
    loss = model(input_ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _gathered_grads(pipe) -> dict[str, torch.Tensor]:
    """Every rank's owned gradients, merged (a parameter owned twice must agree)."""
    mine = {name: p.grad.clone() for name, p in pipe.model.named_parameters()
            if name in pipe.owned_parameter_names() and p.grad is not None}
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, grad in part.items():
            if name in merged:
                torch.testing.assert_close(merged[name], grad, rtol=0, atol=0)
            merged[name] = grad
    return merged


def _check_case(case: Case, microbatches: int = MICROBATCHES, microbatch_size: int = MICROBATCH_SIZE) -> None:
    model = _model(case)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 48, (microbatches * microbatch_size, SEQ_LEN), generator=generator)
    labels = torch.randint(0, 48, input_ids.shape, generator=generator)
    ref_loss, ref_grads = _reference(model, input_ids, labels)
    measured = {}
    for cache in (True, False):
        config = PipelineConfig(schedule=case.schedule, stages_per_rank=case.stages_per_rank,
                                num_microbatches=microbatches, microbatch_size=microbatch_size, seq_len=SEQ_LEN,
                                allow_partial_blocks=case.allow_partial, cache=cache)
        pipe = build_pipeline(copy.deepcopy(model), config)
        for step in range(2 if cache else 1):  # a second step: buffers, cache and counter reset cleanly
            pipe.model.zero_grad(set_to_none=True)
            loss = pipe.step(input_ids, labels)
            label = f"{case.residual} {case.schedule} V={case.stages_per_rank} cache={cache} step {step}"
            if pipe.has_last:
                torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL, msg=f"{label}: loss")
            grads = _gathered_grads(pipe)
            assert set(grads) == {name for name, g in ref_grads.items() if g is not None}, label
            for name, grad in grads.items():
                torch.testing.assert_close(grad, ref_grads[name], rtol=RTOL, atol=GRAD_ATOL,
                                           msg=lambda detail, name=name: f"{label}: grad of {name}: {detail}")
        measured[cache] = pipe.counter.totals()
    tensor_bytes = microbatch_size * SEQ_LEN * HIDDEN * 4  # one (b, T, D) fp32 tensor
    expect_cached = [microbatches * n * tensor_bytes for n in case.cached]
    expect_uncached = [microbatches * n * tensor_bytes for n in case.uncached]
    on, off = measured[True], measured[False]
    assert list(on.forward_per_edge) == expect_cached, (case, on)
    assert list(on.backward_per_edge) == expect_cached, (case, on)  # one gradient back per tensor sent
    assert list(off.forward_per_edge) == expect_uncached, (case, off)
    assert list(off.backward_per_edge) == expect_uncached, (case, off)
    assert on.forward_uncached == on.backward_uncached == off.forward_sent, (case, on, off)
    if case.stages_per_rank == 1:
        assert on.forward_sent == off.forward_sent, case
    if case.v_fold:  # method §5: with one block per stage the largest transition shrinks V-fold
        assert max(case.uncached) == case.stages_per_rank * max(case.cached), case


def _run_cases(rank: int, world_size: int, cases, microbatches: int, microbatch_size: int) -> None:
    for case in cases:
        _check_case(case, microbatches, microbatch_size)


def test_two_ranks_match_unsplit_model_and_cache_bytes():
    """2 ranks: 2 stages (GPipe, 1F1B) and 4 stages (interleaved 1F1B, V=2), five residual variants."""
    run_workers(_run_cases, 2, CASES, MICROBATCHES, MICROBATCH_SIZE)


def test_four_ranks_interleaved_match_unsplit_model_and_cache_bytes():
    """4 ranks x 2 virtual stages = 8 stages of one layer each, Block AttnRes."""
    run_workers(_run_cases, 4, [FOUR_RANKS], 4, 1)
