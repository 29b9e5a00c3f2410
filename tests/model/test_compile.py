"""The routed forward and backward trace as one graph under torch.compile (no graph breaks)."""

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from tests.helpers import activate_routing, options_of


# Full and Delta AttnRes route in chunks (5 and 4 routers: automatic C = 2; C = 3 splits Full's 5 as 3 + 2).
@pytest.mark.parametrize("residual, num_blocks, exact, chunk", [
    ("full_attnres", None, None, None), ("full_attnres", None, None, 3), ("block_attnres", 2, None, None),
    ("delta_attnres", None, None, None), ("delta_block", 2, "partial", None), ("delta_block", 2, "gate", None),
    ("denseformer", None, None, None), ("hyper_connections", None, None, None), ("mhc", None, None, None)])
def test_fullgraph_compile_matches_eager(residual, num_blocks, exact, chunk):
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual=residual,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact))
    model = AttnResLM(config).set_routing(chunk_size=chunk)
    assert model.residual.impl == "auto"  # the fused C++ custom ops on CPU once built, else the lean ones
    activate_routing(model.routers)
    ids = torch.randint(0, 64, (2, 8))
    # aot_eager traces forward and backward like inductor but skips code generation (fast in CI).
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(ids, labels=ids, return_routing=True)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref = model(ids, labels=ids, return_routing=True)
    ref.loss.backward()
    torch.testing.assert_close(out.logits, ref.logits)
    for got, expected in zip(out.routing, ref.routing):
        torch.testing.assert_close(got, expected)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def test_a_padded_batch_compiles_as_one_graph():
    """attention_mask under fullgraph=True: no value is read back while compiling (the mask is
    checked and dropped only in eager), and the compiled logits equal eager ones."""
    from tests.model.test_padding import pad, sequences

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual="delta_block",
                         residual_options={"num_blocks": 2, "exact_conversion": "gate"})
    model = AttnResLM(config).eval()
    activate_routing(model.routers)
    ids, mask = pad(sequences(), "left")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
