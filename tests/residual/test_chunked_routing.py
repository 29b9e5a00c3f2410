"""Chunked two-phase routing of the per-sub-layer variants (Full and Delta AttnRes) computes the
reference's function for every chunk size, and keeps no more for backward than it should.

A chunk of C consecutive routers is routed in one call over the sources completed before it
(phase 1); each later router of the chunk merges the sub-layer outputs produced inside the chunk so
far (phase 2). The 6-layer models here have 13 (Full: 12 sub-layers and the final router) and 12
(Delta) routers; C = 12 is 2L, C = 13 one chunk for all of Full AttnRes's routers.
"""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.common.errors import InputError
from attnres.residual import check_routing
from attnres.residual.scheme import auto_chunk_size
from tests.residual.test_fast_paths import (FAST_CPU_IMPLS, FP32_ATOL, IDS_IN, assert_as_accurate_under_bf16,
                                             assert_same, pair, run)

CHUNKS = [(residual, chunk) for residual in ("full_attnres", "delta_attnres") for chunk in (1, 2, 3, 12)]
CHUNKS.append(("full_attnres", 13))
IDS = [f"{residual}-C{chunk}" for residual, chunk in CHUNKS]


def chunked_pair(residual, chunk, dtype=torch.float32, impl="lean"):
    reference, fast = pair(residual, None, None, impl, dtype)
    chunked = AttnResLM(fast.config).set_routing(impl, chunk).to(dtype)
    chunked.load_state_dict(reference.state_dict())
    assert chunked.residual.group_size == chunk
    return reference, chunked


@pytest.mark.parametrize("impl", FAST_CPU_IMPLS)
@pytest.mark.parametrize("residual, chunk", CHUNKS, ids=IDS)
def test_equals_reference_float64(residual, chunk, impl):
    reference, chunked = chunked_pair(residual, chunk, torch.float64, impl)
    assert_same(run(chunked, IDS_IN), run(reference, IDS_IN), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", FAST_CPU_IMPLS)
@pytest.mark.parametrize("residual, chunk", CHUNKS, ids=IDS)
def test_equals_reference_fp32_and_bf16_autocast(residual, chunk, impl):
    reference, chunked = chunked_pair(residual, chunk, impl=impl)
    fp32 = run(reference, IDS_IN)
    assert_same(run(chunked, IDS_IN), fp32, rtol=1e-5, atol=FP32_ATOL[impl])
    # bf16: as accurate as the reference path against fp32 (CPUs round bf16 differently; see test_fast_paths).
    assert_as_accurate_under_bf16(run(chunked, IDS_IN, autocast=True), run(reference, IDS_IN, autocast=True), fp32)


@pytest.mark.parametrize("residual, chunk", [("full_attnres", 3), ("delta_attnres", 2)])
def test_equals_reference_under_activation_checkpointing(residual, chunk):
    reference, chunked = chunked_pair(residual, chunk)
    chunked.activation_checkpointing = True
    assert_same(run(chunked, IDS_IN), run(reference, IDS_IN), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("residual", ["full_attnres", "delta_attnres", "block_attnres", "delta_block"])
def test_a_state_resumed_inside_a_group_continues_exactly(residual):
    """A pipeline stage rebuilds the state from what it received, possibly in the middle of a chunk
    (or block): it routes phase 1 of the chunk's remaining routers over the sources it has, which is
    the same function. Checked at every split point."""
    if "block" in residual:
        _, model = pair(residual, 4, None, "lean", torch.float64)
    else:
        _, model = chunked_pair(residual, 5, torch.float64)
    expected = model(IDS_IN).logits
    rope = model.rotary(torch.arange(IDS_IN.shape[1]), torch.float64)
    for split in range(1, model.config.num_sublayers):
        state = model.residual.start(model.embed_tokens(IDS_IN))
        model.run_sublayers(state, 0, split, rope)
        resumed = model.residual.resume(state.stream, list(state.sources), state.partial)
        model.run_sublayers(resumed, split, model.config.num_sublayers, rope)
        torch.testing.assert_close(model.output_logits(resumed), expected, rtol=1e-12, atol=1e-12, msg=f"split {split}")


def saved_storage_bytes(model, ids):
    """Bytes of every distinct storage autograd saves in a training forward, parameters excluded."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    return sum(size for pointer, size in storages.items() if pointer not in parameters)


@pytest.mark.parametrize("residual", ["full_attnres", "delta_attnres"])
def test_activation_memory_of_chunking(residual):
    """Against routing every router alone (C = 1), which keeps per-token scalars and references only:
    in "replace" routing (Full) a chunk's merge keeps its output, which is the next sub-layer's input
    and saved by its norm anyway, so chunking keeps nothing more than per-token scalars; in "add"
    routing (Delta) it keeps one (B, T, D) output per merging router, R (1 - 1/C) of them."""
    config = ModelConfig(vocab_size=64, hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=2,
                         intermediate_size=128, residual=residual)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    alone = saved_storage_bytes(AttnResLM(config).set_routing("lean", 1), ids)
    chunk = 4
    chunked = saved_storage_bytes(AttnResLM(config).set_routing("lean", chunk), ids)
    one_tensor = ids.numel() * config.hidden_size * 4
    routers = config.num_sublayers + (residual == "full_attnres")
    merging = routers - -(-routers // chunk)  # every router but each chunk's first
    allowed = 0 if residual == "full_attnres" else merging
    assert chunked - alone <= allowed * one_tensor + one_tensor / 2, (chunked - alone) / one_tensor
    if residual == "delta_attnres":
        assert chunked - alone >= (merging - 0.5) * one_tensor  # the accounting above is the real one


def test_automatic_chunk_size_is_about_sqrt_of_the_routers():
    assert [auto_chunk_size(r) for r in (1, 4, 13, 25, 48, 49, 97)] == [1, 2, 4, 5, 7, 7, 10]
    full = AttnResLM(ModelConfig(vocab_size=64, hidden_size=32, num_layers=24, num_heads=4, num_kv_heads=2,
                                 intermediate_size=64, residual="full_attnres"))
    assert full.residual.group_size == 7  # 49 routers


@pytest.mark.parametrize("residual, num_blocks, chunk, match", [
    ("block_attnres", 4, 2, "applies only to per-sub-layer routing"),
    ("standard", None, 2, "applies only to per-sub-layer routing"),
    ("full_attnres", None, 0, "positive integer"),
    ("full_attnres", None, 14, "from 1 to the number of routers \\(13\\)"),
    ("delta_attnres", None, 13, "from 1 to the number of routers \\(12\\)"),
    ("delta_attnres", None, 2.0, "positive integer"),
])
def test_invalid_chunk_sizes_are_refused_by_name(residual, num_blocks, chunk, match):
    """The chunk size is a run setting: a run's train.routing_chunk_size is checked against the model
    (`check_routing`, as RunConfig does), and a model's `set_routing` refuses it too."""
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual=residual,
                         residual_options=None if num_blocks is None else {"num_blocks": num_blocks})
    with pytest.raises(InputError, match="train.routing_chunk_size") as error:
        check_routing(residual, config.residual_options, config.num_layers, "auto", chunk, prefix="train.")
    assert error.match(match)
    model = AttnResLM(config)
    with pytest.raises(InputError, match="routing_chunk_size") as error:
        model.set_routing("auto", chunk)
    assert error.match(match)
