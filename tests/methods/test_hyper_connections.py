"""The stream mixers of hyper-connections and mHC (method §7.3): mHC against transformers'
DeepSeek-V4 implementation on identical weights, gradcheck of every mixing step in float64, the
Sinkhorn-Knopp projection, and the papers' initialisations."""

import pytest
import torch

from attnres.methods.hyper_connections import HyperConnection, StreamSum
from attnres.methods.mhc import ManifoldHyperConnection, ManifoldHyperHead, sinkhorn

D, N = 8, 4


def streams(dtype=torch.float64, shape=(2, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, N, D, generator=g, dtype=dtype)


def randomised(mixer, seed=1, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return mixer


def deepseek_config(**overrides):
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    return DeepseekV4Config(hidden_size=D, hc_mult=N, rms_norm_eps=1e-6, **overrides)


@pytest.fixture(params=["float32", "float64"])
def precision(request, monkeypatch):
    """(dtype, tolerance). transformers' modules cast to float32 (`.float()`) whatever the input;
    for float64 those casts are made no-ops here, so its arithmetic runs in float64 too."""
    if request.param == "float32":
        return torch.float32, 1e-6
    cast = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t: t if t.dtype == torch.float64 else cast(t))
    return torch.float64, 1e-12


def test_mhc_step_equals_transformers_deepseek_v4_hyper_connection(precision):
    """Identical weights -> the same post, comb, collapsed input and sub-layer step as
    `DeepseekV4HyperConnection` and `DeepseekV4DecoderLayer`'s update, in both precisions."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    dtype, tol = precision
    torch.manual_seed(0)
    theirs = DeepseekV4HyperConnection(deepseek_config()).to(dtype)
    ours = randomised(ManifoldHyperConnection(D, 1e-6, num_streams=N), scale=0.3).to(dtype)
    with torch.no_grad():
        theirs.load_state_dict(ours.state_dict())  # fn, base, scale: the same names
        x = streams(dtype)
        post, comb, collapsed = theirs(x)
        assert comb.dtype == dtype
        h, weights, (our_post, our_comb) = read(ours, x)
        torch.testing.assert_close(h, collapsed, rtol=tol, atol=tol)
        torch.testing.assert_close(our_post, post, rtol=tol, atol=tol)
        torch.testing.assert_close(our_comb, comb, rtol=tol, atol=tol)
        out = torch.randn(2, 3, D, dtype=dtype)  # a sub-layer's output
        their_step = post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
        torch.testing.assert_close(ours.write(x, out, (our_post, our_comb)), their_step, rtol=tol, atol=tol)
        # the papers' formulas as written (the reference path) give the same
        h_ref, _, (post_ref, comb_ref) = read(ours, x, lean=False)
        torch.testing.assert_close(h_ref, collapsed, rtol=tol, atol=tol)
        torch.testing.assert_close(comb_ref, comb, rtol=tol, atol=tol)
    assert (comb - comb.mean()).abs().max() > 1e-2  # guards the test: a non-trivial mixing matrix


def test_mhc_head_equals_transformers_deepseek_v4_hyper_head(precision):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead

    dtype, tol = precision
    theirs = DeepseekV4HyperHead(deepseek_config()).to(dtype)
    ours = randomised(ManifoldHyperHead(D, 1e-6, num_streams=N), scale=0.3).to(dtype)
    with torch.no_grad():
        theirs.load_state_dict({f"hc_{name}": value for name, value in ours.state_dict().items()})
        x = streams(dtype)
        torch.testing.assert_close(ours(x)[0], theirs(x), rtol=tol, atol=tol)
        torch.testing.assert_close(ours(x, lean=False)[0], theirs(x), rtol=tol, atol=tol)


def test_sinkhorn_gives_a_doubly_stochastic_matrix():
    g = torch.Generator().manual_seed(0)
    positive = torch.rand(5, N, N, generator=g, dtype=torch.float64) * 10 + 0.01
    projected = sinkhorn(positive, 20, 0.0)
    torch.testing.assert_close(projected.sum(-2), torch.ones(5, N, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(projected.sum(-1), torch.ones(5, N, dtype=torch.float64), rtol=0, atol=1e-3)
    assert not torch.allclose(sinkhorn(positive, 1, 0.0).sum(-1), torch.ones(5, N, dtype=torch.float64), atol=1e-2)


@pytest.mark.parametrize("make", [
    lambda: HyperConnection(D, 1e-6, num_streams=N, index=2, dynamic=False),
    lambda: HyperConnection(D, 1e-6, num_streams=N, index=1, dynamic=True),
    lambda: ManifoldHyperConnection(D, 1e-6, num_streams=N, index=0, sinkhorn_iters=4),
], ids=["hc-static", "hc-dynamic", "mhc"])
def test_read_and_write_pass_gradcheck(make):
    """Both steps, and the coefficients' parameters, in float64 (every parameter moved off its start)."""
    mixer = randomised(make()).double()
    x = streams(shape=(1, 2)).requires_grad_()
    delta = torch.randn(1, 2, D, dtype=torch.float64, requires_grad=True)
    params = list(mixer.parameters())

    def step(x, delta, *values):
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        written = []
        h, _ = torch.func.functional_call(mixer, dict(zip([n for n, _ in mixer.named_parameters()], values)),
                                          (x, False), {"written": written})
        return h, mixer.write(x, delta, written[0])

    values = [p.detach().clone().requires_grad_() for p in params]
    assert torch.autograd.gradcheck(step, (x, delta, *values), eps=1e-6, atol=1e-6)


def read(mixer, x, **kwargs):
    """A stream mixer's read: (h, weights, the write coefficients it appends to `written`)."""
    written = []
    h, weights = mixer(x, written=written, **kwargs)
    return h, weights, written[0]


def test_hyper_connection_initialisation_is_the_papers():
    """a_pre = e_{s mod n}, a_post = 1, A_res = I; dynamic corrections zero at the start."""
    mixer = HyperConnection(D, 1e-6, num_streams=N, index=6)
    pre, post, res = mixer.coefficients(streams())
    assert torch.equal(pre, torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64).expand(2, 3, N))
    assert torch.equal(post, torch.ones(2, 3, N, dtype=torch.float64))
    assert torch.equal(res, torch.eye(N, dtype=torch.float64).expand(2, 3, N, N))
    assert mixer.alpha_scale.item() == pytest.approx(0.01) and mixer.beta_scale.item() == pytest.approx(0.01)


def test_mhc_initialisation_is_transformers_deepseek_v4s():
    """fn ~ N(0, init_std), base 0, scale 1 (what `DeepseekV4PreTrainedModel` draws)."""
    torch.manual_seed(0)
    mixer = ManifoldHyperConnection(64, 1e-6, num_streams=N, init_std=0.05)
    assert abs(mixer.fn.std().item() - 0.05) < 0.002 and abs(mixer.fn.mean().item()) < 0.002
    assert torch.equal(mixer.base, torch.zeros_like(mixer.base)) and torch.equal(mixer.scale, torch.ones(3))
    head = ManifoldHyperHead(64, 1e-6, num_streams=N, init_std=0.05)
    assert abs(head.fn.std().item() - 0.05) < 0.005


def test_mhc_with_a_zero_projection_keeps_equal_streams_equal():
    """fn = 0: a_pre = 1/2 + eps, a_post = 1, A_res = 1/n; equal streams x stay equal, x + delta."""
    mixer = ManifoldHyperConnection(D, 1e-6, num_streams=N)
    with torch.no_grad():
        mixer.fn.zero_()
    x = torch.randn(2, 3, 1, D, dtype=torch.float64).expand(2, 3, N, D)
    h, weights, written = read(mixer, x)
    torch.testing.assert_close(h, (N * (0.5 + 1e-6)) * x[:, :, 0])
    torch.testing.assert_close(written[1], torch.full((2, 3, N, N), 1 / N, dtype=torch.float64), rtol=1e-5, atol=0)
    delta = torch.randn(2, 3, D, dtype=torch.float64)
    torch.testing.assert_close(mixer.write(x, delta, written), (x[:, :, 0] + delta).unsqueeze(-2).expand(2, 3, N, D),
                               rtol=0, atol=1e-5)  # column sums 1 - O(hc_eps)


def test_final_collapses():
    x = streams()
    assert torch.equal(StreamSum(N, x.shape[-1])(x)[0], x.sum(-2))
    head = ManifoldHyperHead(D, 1e-6, num_streams=N)
    with torch.no_grad():
        head.fn.zero_()
    hidden, weights = head(x)
    torch.testing.assert_close(hidden, (0.5 + 1e-6) * x.sum(-2))
    assert weights.shape == (2, 3, N)


def test_bf16_autocast_keeps_the_streams_in_fp32():
    mixer = ManifoldHyperConnection(D, 1e-6, num_streams=N)
    x = streams(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, _, written = read(mixer, x)
        out = mixer.write(x, torch.randn(2, 3, D, dtype=torch.bfloat16), written)
    assert h.dtype == torch.float32 and out.dtype == torch.float32 and written[1].dtype == torch.float32


@pytest.mark.parametrize("bad, match", [({"num_streams": 0}, "num_streams"), ({"index": -1}, "index"),
                                        ({"gated": True}, "gate")])
def test_bad_arguments_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        HyperConnection(D, 1e-6, **{"num_streams": N, "index": 0, **bad})
