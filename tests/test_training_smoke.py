"""Every variant trains: 30 AdamW steps on a fixed tiny batch lower the loss, with no NaN."""

import math

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from tests.helpers import options_of, train_losses

VARIANTS = [("standard", None, None), ("full_attnres", None, None), ("block_attnres", 2, None),
            ("delta_attnres", None, None), ("delta_block", 2, None), ("delta_block", 2, "gate"),
            ("delta_block", 2, "partial"), ("denseformer", None, None),
            ("hyper_connections", None, None), ("mhc", None, None)]


@pytest.mark.parametrize("residual, num_blocks, exact", VARIANTS)
def test_thirty_adamw_steps_lower_the_loss(residual, num_blocks, exact):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual=residual,
                         residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact))
    model = AttnResLM(config)
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = train_losses(model, batch, 30, weight_decay=0.0)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.75 * losses[0], losses
    # the mixers learn too: every parameter of theirs leaves its start, except the logit's (query and key
    # norm) of a router that sees a single source, whose softmax is 1 whatever the logit: no gradient reaches it
    fresh = dict(AttnResLM(config).residual.named_parameters())
    sources = model.residual.source_names() if hasattr(model.residual, "source_names") else None
    for name, weight in model.residual.named_parameters():
        moved = float((weight - fresh[name]).detach().abs().max())
        parts = name.split(".")
        single = (sources is not None and parts[0] == "routers" and parts[2] in ("query", "key_norm")
                  and len(sources[int(parts[1])]) == 1)
        assert (moved == 0.0) if single else (moved > 1e-3), (name, moved)


def test_training_under_bf16_autocast():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, residual="block_attnres",
                         residual_options={"num_blocks": 2})
    model = AttnResLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(20):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch, labels=batch, return_routing=True)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert all(w.dtype == torch.float32 for w in out.routing)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert math.isfinite(losses[-1]) and losses[-1] < 0.85 * losses[0]
