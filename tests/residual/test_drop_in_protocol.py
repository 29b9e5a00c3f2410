"""The drop-in `ResidualScheme` enforces its protocol (issue 59, item 6): sub-layers in order, each
input read once before its output, `finish` once after the last sub-layer, and a (B, T, hidden_size)
embedding. Each misuse is one line naming the call expected; a correct loop computes the model's
forward, eagerly, on the fast paths and under torch.compile, and the checks add no tensor op."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnres
from attnres.common.errors import InputError
from tests.analysis.models import tiny_model
from tests.helpers import activate_routing

VARIANTS = [("standard", {}), ("full_attnres", {}), ("block_attnres", {"num_blocks": 2}), ("delta_attnres", {}),
            ("delta_block", {"num_blocks": 2, "exact_conversion": "gate"}), ("denseformer", {}),
            ("hyper_connections", {}), ("mhc", {})]
WIDTH, LAYERS = 32, 2  # 4 sub-layers


def scheme(residual="block_attnres", options=None):
    if options is None:
        options = dict(VARIANTS)[residual]
    return attnres.build_residual(residual, num_layers=LAYERS, hidden_size=WIDTH, **options)


def delta():
    return torch.randn(2, 8, WIDTH)


def refused(call, *args) -> str:
    """The one-line InputError message of a refused call."""
    with pytest.raises(InputError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


def model_pieces_loop(model, ids):
    """The model's forward written as a drop-in loop over its pieces: logits (B, T, V)."""
    embedding = model.embed_tokens(ids)
    rope = model.rotary(torch.arange(ids.shape[1]), embedding.dtype)
    residual = model.residual
    state = residual.start(embedding)
    for i, layer in enumerate(model.layers):
        residual.after(2 * i, state, layer.attention_delta(residual.sublayer_input(2 * i, state), rope))
        residual.after(2 * i + 1, state, layer.mlp_delta(residual.sublayer_input(2 * i + 1, state)))
    return model.lm_head(model.norm(residual.finish(state)))


# ------------------------------------------------------------------ misuse, refused in one line


@pytest.mark.parametrize("residual", [name for name, _ in VARIANTS])
def test_an_output_before_the_earlier_sub_layers_is_refused(residual):
    built = scheme(residual)
    state = built.start(torch.randn(2, 8, WIDTH))
    message = refused(built.after, 3, state, delta())
    assert message.startswith("after(3, state, delta) out of order") and "sublayer_input(0, state)" in message


@pytest.mark.parametrize("residual", [name for name, _ in VARIANTS])
def test_finish_before_the_last_sub_layer_is_refused(residual):
    built = scheme(residual)
    state = built.start(torch.randn(2, 8, WIDTH))
    built.after(0, state, built.sublayer_input(0, state))
    message = refused(built.finish, state)
    assert message.startswith("finish(state) out of order") and "sublayer_input(1, state): 1 of 4" in message


@pytest.mark.parametrize("residual", [name for name, _ in VARIANTS])
def test_an_embedding_of_the_wrong_width_or_rank_is_refused(residual):
    built = scheme(residual)
    message = refused(built.start, torch.randn(2, 8, 16))
    assert "(B, T, 32)" in message and "(2, 8, 16)" in message
    assert "(8, 32)" in refused(built.start, torch.randn(8, WIDTH))
    assert "list" in refused(built.start, [[0.0] * WIDTH])


def test_a_skipped_index_is_refused():
    built = scheme()
    state = built.start(torch.randn(2, 8, WIDTH))
    assert "sublayer_input(0, state)" in refused(built.sublayer_input, 1, state)
    built.after(0, state, built.sublayer_input(0, state))
    message = refused(built.sublayer_input, 2, state)
    assert message.startswith("sublayer_input(2, state) out of order") and "sublayer_input(1, state)" in message
    assert "sublayer_input(1, state)" in refused(built.after, 2, state, delta())


def test_a_repeated_index_is_refused():
    built = scheme()
    state = built.start(torch.randn(2, 8, WIDTH))
    built.sublayer_input(0, state)
    assert "the next call is after(0, state, delta)" in refused(built.sublayer_input, 0, state)
    built.after(0, state, delta())
    assert "sublayer_input(1, state)" in refused(built.after, 0, state, delta())
    assert "sublayer_input(1, state)" in refused(built.sublayer_input, 0, state)


def test_after_the_last_sub_layer_only_finish_and_after_finish_nothing():
    built = scheme()
    state = built.start(torch.randn(2, 8, WIDTH))
    for s in range(4):
        built.after(s, state, built.sublayer_input(s, state))
    assert "the next call is finish(state): all 4 sub-layers are done" in refused(built.sublayer_input, 4, state)
    assert "finish(state)" in refused(built.after, 4, state, delta())
    built.finish(state)
    assert "finish(state) has run" in refused(built.finish, state)
    assert "start a new pass with start(embedding)" in refused(built.sublayer_input, 0, state)


def test_a_refused_call_leaves_the_state_as_it_was():
    """The check runs before anything changes: the correct call goes on and the result is the one of
    a loop without the mistake."""
    torch.manual_seed(0)
    built = scheme("full_attnres")
    activate_routing(built.routers)
    embedding, deltas = torch.randn(2, 8, WIDTH), [delta() for _ in range(4)]

    def run(mistake: bool):
        state = built.start(embedding)
        for s in range(4):
            if mistake and s == 2:
                refused(built.after, 3, state, deltas[3])
                refused(built.finish, state)
            built.after(s, state, deltas[s] + built.sublayer_input(s, state))
        return built.finish(state)

    assert torch.equal(run(True), run(False))


def test_the_stream_schemes_need_the_read_before_the_output():
    """Hyper-connections and mHC write an output with the coefficients their read computed."""
    for residual in ("hyper_connections", "mhc"):
        built = scheme(residual)
        state = built.start(torch.randn(2, 8, WIDTH))
        message = refused(built.after, 0, state, delta())
        assert message.startswith("after(0, state, delta) out of order") and "sublayer_input(0, state)" in message


def test_one_input_may_feed_two_sub_layers_where_the_mode_allows():
    """A parallel block (attention and MLP reading one input) skips the MLP's read: allowed where
    `after` does not need it, still in order."""
    built = scheme("block_attnres")
    state = built.start(torch.randn(2, 8, WIDTH))
    for i in range(LAYERS):
        h = built.sublayer_input(2 * i, state)
        built.after(2 * i, state, torch.tanh(h))
        built.after(2 * i + 1, state, torch.sin(h))
    assert built.finish(state).shape == (2, 8, WIDTH)


def test_a_resumed_state_takes_its_position_from_its_first_call():
    """A pipeline stage resumes part-way; its first sub-layer sets the position, which is then checked."""
    built = scheme("block_attnres")
    state = built.start(torch.randn(2, 8, WIDTH))
    for s in range(2):
        built.after(s, state, built.sublayer_input(s, state))
    resumed = built.resume(state.stream, list(state.sources), state.partial)
    assert resumed.next_sublayer is None
    assert "integer from 0 to 3" in refused(built.sublayer_input, 4, resumed)
    built.after(2, resumed, built.sublayer_input(2, resumed))
    assert "sublayer_input(3, state)" in refused(built.finish, resumed)
    built.after(3, resumed, built.sublayer_input(3, resumed))
    assert built.finish(resumed).shape == (2, 8, WIDTH)


def test_input_error_is_a_value_error():
    built = scheme()
    with pytest.raises(ValueError):
        built.finish(built.start(torch.randn(2, 8, WIDTH)))


# ------------------------------------------------------------------ a correct loop: unchanged


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("residual, options", VARIANTS)
def test_a_correct_loop_matches_the_models_forward(residual, options, impl):
    """The model's own decoder loop and the drop-in loop over its pieces give the same logits, on the
    reference routing and on the fast paths ("auto": two-phase chunks, fused or lean kernels)."""
    model = tiny_model(residual, routing_impl=impl, **options).eval()
    activate_routing(model.routers)
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model_pieces_loop(model, ids), model(ids).logits)


def test_a_correct_loop_compiles_as_one_graph():
    """The bookkeeping is plain Python ints: torch.compile(fullgraph=True) traces the loop without a
    graph break, and a compiled pass computes the eager one."""
    torch._dynamo.reset()
    model = tiny_model("block_attnres", num_blocks=2).eval()
    activate_routing(model.routers)
    ids = torch.randint(0, 64, (2, 7))
    compiled = torch.compile(model_pieces_loop, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(model, ids), model(ids).logits)


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_checks_run_no_tensor_op():
    """The protocol costs a few integer comparisons per call: a standard pass dispatches exactly its
    2L additions, so the checks add no tensor op and no device sync."""
    built = scheme("standard")
    embedding, deltas = torch.randn(2, 8, WIDTH), [delta() for _ in range(4)]
    with _CountOps() as counted:
        state = built.start(embedding)
        for s in range(4):
            built.sublayer_input(s, state)
            built.after(s, state, deltas[s])
        built.finish(state)
    assert counted.ops == ["aten.add.Tensor"] * 4
