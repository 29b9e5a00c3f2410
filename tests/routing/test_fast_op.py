"""fast_op: one description of an op with a hand-written backward, checked in its three forms (eager
autograd.Function, no-grad forward, custom op under torch.compile) against plain autograd."""

import pytest
import torch
from torch import Tensor

from attnres.routing.fast_op import FastOp

calls = {"forward": 0, "backward": 0}


def scaled_sum(x: Tensor, ys: list[Tensor], scale: float) -> tuple[Tensor, Tensor]:
    """out = scale * (x + sum ys), sq = sum of x^2 over the last dim: (..., D) -> ((..., D), (...))."""
    calls["forward"] += 1
    out = x * scale
    for y in ys:
        out = out + y * scale
    return out, (x * x).sum(-1)


def scaled_sum_backward(saved, grad_out, grad_sq):
    """By hand; saved is (x, ys, scale), as save returned it (ys a list again, scale a float)."""
    calls["backward"] += 1
    x, ys, scale = saved
    assert isinstance(ys, list) and isinstance(scale, float)
    grad_x = None if grad_out is None else grad_out * scale
    if grad_sq is not None:
        grad_x = 2 * x * grad_sq.unsqueeze(-1) + (0 if grad_x is None else grad_x)
    grad_ys = None if grad_out is None else [grad_out * scale for _ in ys]
    return grad_x, grad_ys, None


op = FastOp("attnres_test::scaled_sum", scaled_sum,
            fake=lambda x, ys, scale: (torch.empty_like(x), x.new_empty(x.shape[:-1])),
            save=lambda inputs, output: inputs, backward=scaled_sum_backward, materialize_grads=False)

SCALE = 0.5


def make_inputs(dtype=torch.float32, num_ys=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 4, generator=generator, dtype=dtype).requires_grad_() for _ in range(1 + num_ys)]


def loss_of(outputs, use):
    """A loss of the outputs named in `use` ("out", "sq"), with weights so that gradients are not uniform."""
    out, sq = outputs
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    terms = {"out": (out * weight).sum(), "sq": (sq * sq).sum()}
    return sum(terms[name] for name in use)


def grads_of(fn, tensors, use):
    loss = loss_of(fn(*tensors), use)
    return torch.autograd.grad(loss, tensors, allow_unused=True)


def through_op(x, *ys):
    return op(x, list(ys), SCALE)


def plain(x, *ys):
    return scaled_sum(x, list(ys), SCALE)


def assert_same(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("use", [("out",), ("sq",), ("out", "sq")], ids="+".join)
def test_eager_grad_form_is_the_autograd_function_with_the_hand_written_backward(use):
    tensors = make_inputs()
    outputs = through_op(*tensors)
    assert type(outputs[0].grad_fn).__name__ == "_ScaledSumBackward"  # the name follows the op's
    before = calls["backward"]
    got = torch.autograd.grad(loss_of(outputs, use), tensors, allow_unused=True)
    assert calls["backward"] == before + 1
    assert_same(outputs, plain(*tensors))
    # Only "sq" used: the backward gets None for out (materialize_grads=False), the ys no gradient.
    assert_same(got, grads_of(plain, tensors, use))
    assert (got[1] is None) == (use == ("sq",))


def test_a_gradient_needed_only_by_a_listed_input_takes_the_autograd_form():
    x, *ys = make_inputs()
    x = x.detach()
    out, _ = op(x, ys, SCALE)
    assert type(out.grad_fn).__name__ == "_ScaledSumBackward"
    got = torch.autograd.grad(out.sum(), ys)
    assert_same(got, [torch.full_like(y, SCALE) for y in ys])


def test_without_a_gradient_the_forward_runs_alone():
    tensors = make_inputs()
    with torch.no_grad():
        outputs = through_op(*tensors)
    assert all(t.grad_fn is None for t in outputs)
    assert_same(outputs, plain(*tensors))
    detached = [t.detach() for t in tensors]
    outputs = through_op(*detached)
    assert all(t.grad_fn is None and not t.requires_grad for t in outputs)


@pytest.mark.compile
def test_compiled_with_a_gradient_is_the_custom_op_and_without_one_the_plain_forward():
    from torch._dynamo.backends.debugging import aot_eager

    graphs = []

    def record(graph_module, example_inputs):
        graphs.append({str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"})
        return aot_eager(graph_module, example_inputs)  # AOTAutograd: the fake and the registered backward

    torch._dynamo.reset()
    compiled = torch.compile(through_op, backend=record, fullgraph=True)
    tensors = make_inputs()
    got = grads_of(compiled, tensors, ("out", "sq"))
    assert "attnres_test.scaled_sum.default" in graphs[-1], graphs
    assert_same(got, grads_of(plain, tensors, ("out", "sq")))
    assert_same(compiled(*tensors), plain(*tensors))
    with torch.no_grad():
        outputs = compiled(*tensors)
    assert not any("scaled_sum" in target for target in graphs[-1]), graphs  # traced through, fusable
    assert_same(outputs, plain(*tensors))


@pytest.mark.parametrize("form", ["eager", "custom op"])
def test_gradcheck_float64(form):
    tensors = make_inputs(torch.float64)
    fn = through_op if form == "eager" else lambda x, *ys: op.op(x, list(ys), SCALE)
    assert torch.autograd.gradcheck(fn, tensors)
