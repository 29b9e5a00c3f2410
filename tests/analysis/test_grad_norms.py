"""Gradient RMS by depth against gradients computed by hand with torch.autograd.grad."""

import math

import pytest
import torch

from attnres.analysis import collect_grad_norms
from attnres.model.decoder import next_token_loss
from tests.analysis.models import batches_of_different_sizes, randomize_routers, tiny_model


VARIANTS = [("standard", None), ("full_attnres", None), ("block_attnres", 2), ("delta_attnres", None),
            ("delta_block", 2)]


def manual_delta_grads(model, ids):
    """d(summed next-token loss)/d(delta_s) for every s, from the model's pieces called by hand."""
    embedding = model.embed_tokens(ids)
    rope = model.rotary(torch.arange(ids.shape[1]), embedding.dtype)
    state = model.residual.start(embedding)
    deltas = []
    for i, layer in enumerate(model.layers):
        deltas.append(layer.attention_delta(model.residual.sublayer_input(2 * i, state), rope))
        model.residual.after(2 * i, state, deltas[-1])
        deltas.append(layer.mlp_delta(model.residual.sublayer_input(2 * i + 1, state)))
        model.residual.after(2 * i + 1, state, deltas[-1])
    logits = model.lm_head(model.norm(model.residual.finish(state)))
    loss = next_token_loss(logits, ids) * (ids.shape[0] * (ids.shape[1] - 1))
    return torch.autograd.grad(loss, deltas)


def pooled_rms(grads_per_batch, s):
    """RMS over the positions that predict a target (all but the last) of every batch together."""
    total = sum(float(g[s][:, :-1].double().pow(2).sum()) for g in grads_per_batch)
    count = sum(g[s][:, :-1].numel() for g in grads_per_batch)
    return math.sqrt(total / count)


@pytest.mark.parametrize("residual, num_blocks", VARIANTS)
def test_grad_norms_equal_autograd_by_hand(residual, num_blocks):
    model = tiny_model(residual, num_blocks)
    randomize_routers(model)
    batches = batches_of_different_sizes()
    norms = collect_grad_norms(model, batches)
    assert len(norms) == 2 * len(model.layers)
    assert all(math.isfinite(v) and v > 0 for v in norms)
    model.eval()
    grads = [manual_delta_grads(model, ids) for ids in batches]
    assert norms == pytest.approx([pooled_rms(grads, s) for s in range(len(norms))], rel=1e-5)
    # Pooling over tokens differs from a mean of per-batch values, and the values differ by depth.
    per_batch_mean = [(pooled_rms(grads[:1], s) + pooled_rms(grads[1:], s)) / 2 for s in range(len(norms))]
    assert norms != pytest.approx(per_batch_mean, rel=1e-3)
    assert max(norms) / min(norms) > 1.01


def test_standard_delta_grad_is_the_grad_of_the_next_stream_state():
    # In a standard residual x_{s+1} = x_s + delta_s, so dL/d(delta_s) = dL/d(x_{s+1}); x_{s+1} is
    # the input of the next sub-layer's norm, and x_{2L} the input of the final norm.
    model = tiny_model("standard").eval()
    ids = batches_of_different_sizes()[1]
    layer = model.layers
    # inputs of sub-layers 1, 2, 3 (x_1, x_2, x_3), then of the final norm (x_4)
    norms = [layer[0].post_attention_layernorm, layer[1].input_layernorm, layer[1].post_attention_layernorm,
             model.norm]
    states = []
    hooks = [n.register_forward_pre_hook(lambda _m, args: states.append(args[0])) for n in norms]
    try:
        out = model(ids, labels=ids)
    finally:
        for h in hooks:
            h.remove()
    grads = torch.autograd.grad(out.loss * ids.shape[0] * (ids.shape[1] - 1), states)
    expected = [float(g[:, :-1].double().pow(2).mean().sqrt()) for g in grads]
    assert collect_grad_norms(model, [ids]) == pytest.approx(expected, rel=1e-5)


def test_last_position_is_left_out_and_batch_size_does_not_matter():
    model = tiny_model("delta_attnres")
    randomize_routers(model)
    ids = batches_of_different_sizes()[1]
    once = collect_grad_norms(model, [ids])
    # The summed loss makes each token's gradient independent of how many tokens share the batch.
    assert collect_grad_norms(model, [torch.cat([ids, ids])]) == pytest.approx(once, rel=1e-5)
    # The last position predicts nothing: its gradient is exactly zero, and counting it would
    # lower the RMS.
    model.eval()
    grads = manual_delta_grads(model, ids)
    assert all(torch.equal(g[:, -1], torch.zeros_like(g[:, -1])) for g in grads)
    with_last = [math.sqrt(float(g.double().pow(2).mean())) for g in grads]
    assert once != pytest.approx(with_last, rel=1e-3)


def test_parameter_grads_are_left_as_found():
    model = tiny_model("block_attnres", 2)
    randomize_routers(model)
    collect_grad_norms(model, batches_of_different_sizes())
    assert all(p.grad is None for p in model.parameters())
    existing = {name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.grad = existing[name].clone()
    collect_grad_norms(model, batches_of_different_sizes())
    assert all(torch.equal(p.grad, existing[name]) for name, p in model.named_parameters())


def test_frozen_parameters_give_the_same_values():
    model = tiny_model("full_attnres")
    randomize_routers(model)
    batches = batches_of_different_sizes()
    trainable = collect_grad_norms(model, batches)
    model.requires_grad_(False)
    assert collect_grad_norms(model, batches) == pytest.approx(trainable, rel=1e-6)
    assert not any(p.requires_grad for p in model.parameters())


def test_wrapper_removed_and_training_flag_restored():
    model = tiny_model("delta_block", 2).train()
    collect_grad_norms(model, batches_of_different_sizes())
    assert model.training and "after" not in vars(model.residual)
    model.eval()
    collect_grad_norms(model, batches_of_different_sizes())
    assert not model.training and "after" not in vars(model.residual)


def test_state_restored_when_a_forward_raises():
    model = tiny_model("full_attnres").train()
    bad = torch.tensor([[1, 2, 99]])  # 99 is outside vocab_size=64
    with pytest.raises(ValueError, match="vocab_size"):
        collect_grad_norms(model, [torch.tensor([[1, 2]]), bad])
    assert model.training and "after" not in vars(model.residual)
    assert all(p.grad is None for p in model.parameters())


def test_an_instance_level_after_is_kept():
    model = tiny_model("standard")
    calls = []
    original = model.residual.after

    def own_after(s, state, delta):
        calls.append(s)
        return original(s, state, delta)

    model.residual.after = own_after
    collect_grad_norms(model, batches_of_different_sizes()[:1])
    assert calls == [0, 1, 2, 3] and vars(model.residual)["after"] is own_after


def test_short_batches_are_skipped():
    model = tiny_model("standard")
    ids = batches_of_different_sizes()[1]
    assert collect_grad_norms(model, [torch.tensor([[3], [4]]), ids]) == collect_grad_norms(model, [ids])
    with pytest.raises(ValueError, match="seq_len >= 2"):
        collect_grad_norms(model, [torch.tensor([[3]])])
