"""Source redundancy: cosine matrices of hand-built sources, and the per-router collector on tiny models."""

import pytest
import torch

import attnres.analysis.redundancy as redundancy
from attnres.analysis import collect_source_cosines, cosine_matrix
from tests.analysis.models import batches_of_different_sizes, randomize_routers, tiny_model


VARIANTS = [("full_attnres", None), ("block_attnres", 2), ("delta_attnres", None), ("delta_block", 2),
            ("mhc", None)]  # mHC: the sources are its n = 4 streams, whatever the batch size


def random_source(seed, shape=(2, 3, 8)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_identical_opposite_and_scaled_sources():
    v = random_source(0)
    scale = torch.rand(2, 3, 1, generator=torch.Generator().manual_seed(1)) * 10 + 0.1  # differs per token
    c = cosine_matrix([v, v.clone(), -v, v * scale, -3 * v])
    expected = torch.tensor([[1, 1, -1, 1, -1],
                             [1, 1, -1, 1, -1],
                             [-1, -1, 1, -1, 1],
                             [1, 1, -1, 1, -1],
                             [-1, -1, 1, -1, 1]], dtype=torch.float64)
    assert c.shape == (5, 5) and c.dtype == torch.float64
    assert torch.allclose(c, expected, atol=1e-6)


def test_orthogonal_sources_and_a_token_mean():
    a = torch.zeros(1, 2, 4)
    b = torch.zeros(1, 2, 4)
    a[0, 0, 0], b[0, 0, 1] = 2.0, 5.0  # token 0: orthogonal (cosine 0)
    a[0, 1, 2], b[0, 1, 2] = 1.0, 3.0  # token 1: same direction (cosine 1)
    c = cosine_matrix([a, b])
    assert torch.allclose(c, torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64), atol=1e-7)
    assert c[0, 1] == c[1, 0]


def test_zero_vectors_have_cosine_zero():
    v = random_source(3, (1, 4, 8))
    z = v.clone()
    z[0, :3] = 0.0  # zero at 3 of 4 tokens
    c = cosine_matrix([v, z, torch.zeros(1, 4, 8)])
    assert not torch.isnan(c).any()
    assert torch.allclose(c, torch.tensor([[1.0, 0.25, 0.0],
                                           [0.25, 0.25, 0.0],   # a zero vector's cosine with itself is 0 too
                                           [0.0, 0.0, 0.0]], dtype=torch.float64), atol=1e-6)


def test_random_sources_against_a_per_token_loop_and_symmetry():
    sources = [random_source(s, (3, 5, 16)) for s in range(4)]
    c = cosine_matrix(sources)
    flat = [v.reshape(-1, 16).double() for v in sources]
    expected = torch.tensor([[float(torch.nn.functional.cosine_similarity(x, y, dim=-1).mean()) for y in flat]
                             for x in flat], dtype=torch.float64)
    assert torch.allclose(c, expected, atol=1e-6)
    assert torch.equal(c, c.T)
    assert (c.abs() <= 1 + 1e-6).all()


def test_chunking_over_tokens_does_not_change_the_result(monkeypatch):
    sources = [random_source(s, (3, 7, 8)) for s in range(3)]
    whole = cosine_matrix(sources)
    monkeypatch.setattr(redundancy, "CHUNK_ELEMENTS", 3 * 8 * 4)  # 4 tokens per chunk: 21 = 5 * 4 + 1
    assert torch.allclose(cosine_matrix(sources), whole, atol=1e-12)


def test_low_precision_sources():
    sources = [random_source(s) for s in range(3)]
    c = cosine_matrix([v.bfloat16() for v in sources])
    assert c.dtype == torch.float64
    assert torch.allclose(c, cosine_matrix(sources), atol=1e-2)
    assert torch.allclose(c.diagonal(), torch.ones(3, dtype=torch.float64), atol=1e-6)


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least one source"):
        cosine_matrix([])
    with pytest.raises(ValueError, match="one shape"):
        cosine_matrix([torch.ones(1, 2, 4), torch.ones(1, 3, 4)])
    with pytest.raises(ValueError, match="at least one token"):
        cosine_matrix([torch.ones(0, 2, 4)])


@pytest.mark.parametrize("residual, num_blocks", VARIANTS)
def test_collector_gives_one_symmetric_matrix_per_router(residual, num_blocks):
    model = tiny_model(residual, num_blocks)
    randomize_routers(model)
    matrices = collect_source_cosines(model, batches_of_different_sizes())
    names = model.residual.source_names()
    assert len(matrices) == len(model.routers) == len(names)
    for c, n in zip(matrices, names):
        assert c.shape == (len(n), len(n)) and c.dtype == torch.float64 and c.device.type == "cpu"
        assert torch.allclose(c.diagonal(), torch.ones(len(n), dtype=torch.float64), atol=1e-6)
        assert torch.equal(c, c.T)
        assert (c.abs() <= 1 + 1e-6).all()
    assert any(len(n) > 1 for n in names)
    assert any((c - torch.eye(len(c), dtype=torch.float64)).abs().max() > 1e-3 for c in matrices)


def test_full_attnres_matrices_equal_cosines_of_embedding_and_deltas_over_all_tokens():
    model = tiny_model("full_attnres")
    randomize_routers(model)
    batches = batches_of_different_sizes()
    matrices = collect_source_cosines(model, batches)
    # Full AttnRes: router s sees [e, delta_0 .. delta_{s-1}], the final router all 2L + 1 of them.
    per_batch = []
    with torch.no_grad():
        for ids in batches:
            values = [model.embed_tokens(ids)]
            deltas = []
            original = model.residual.after
            model.residual.after = lambda s, state, delta: (deltas.append(delta), original(s, state, delta))[1]
            try:
                model(ids)
            finally:
                del model.residual.after
            per_batch.append(values + deltas)
    tokens = [ids.numel() for ids in batches]  # 5 and 21: a per-batch mean would differ
    for r, c in enumerate(matrices):
        k = r + 1
        expected = sum(cosine_matrix(v[:k]) * n for v, n in zip(per_batch, tokens)) / sum(tokens)
        assert torch.allclose(c, expected, atol=1e-6)
        if k > 1:
            unweighted = sum(cosine_matrix(v[:k]) for v in per_batch) / 2
            assert not torch.allclose(c, unweighted, atol=1e-4)


@pytest.mark.parametrize("impl", ["lean", "auto"])
def test_fast_block_path_is_observed_without_switching_paths(impl):
    # The lean two-phase path of Block AttnRes calls every router as a module too (with its
    # group's phase-1 result), so the collector sees the same sources as on the reference path.
    model = tiny_model("block_attnres", 2, routing_impl=impl)
    randomize_routers(model)
    reference = tiny_model("block_attnres", 2, routing_impl="reference")
    randomize_routers(reference)
    model.train()
    got = collect_source_cosines(model, batches_of_different_sizes())
    want = collect_source_cosines(reference, batches_of_different_sizes())
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want))
    assert model.residual.impl == impl and model.training
    for router in model.routers:
        assert len(router._forward_pre_hooks) == 0 and "forward" not in vars(router)


def test_state_restored_when_a_forward_raises():
    model = tiny_model("delta_block", 2, routing_impl="lean").eval()
    bad = torch.tensor([[1, 2, 99]])  # 99 is outside vocab_size=64
    with pytest.raises(ValueError, match="vocab_size"):
        collect_source_cosines(model, [torch.tensor([[1, 2]]), bad])
    assert model.residual.impl == "lean" and not model.training
    assert all(len(router._forward_pre_hooks) == 0 for router in model.routers)


def test_state_restored_when_a_router_hook_raises(monkeypatch):
    model = tiny_model("block_attnres", 2, routing_impl="lean").train()

    def broken(sources):
        raise RuntimeError("boom inside the router hook")

    monkeypatch.setattr(redundancy, "_cosine_sums", broken)
    with pytest.raises(RuntimeError, match="boom"):
        collect_source_cosines(model, batches_of_different_sizes())
    assert model.residual.impl == "lean" and model.training
    assert all(len(router._forward_pre_hooks) == 0 for router in model.routers)
    monkeypatch.undo()
    assert len(collect_source_cosines(model, batches_of_different_sizes())) == len(model.routers)


def test_standard_and_empty_inputs():
    assert collect_source_cosines(tiny_model("standard"), batches_of_different_sizes()) == []
    with pytest.raises(ValueError, match="at least one"):
        collect_source_cosines(tiny_model("full_attnres"), [])
