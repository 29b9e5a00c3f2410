"""The residual scheme as a drop-in: a nanoGPT-style model of one's own, written here against the public
API only (`attnres.build_residual`, the scheme's start / sublayer_input / after / finish, its
parameters), trains with every variant. docs/how-to/drop-in.md shows the same model."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnres


class SelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """nanoGPT's block without its two `x = x + ...` lines: those are the residual scheme's now."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), SelfAttention(n_embd, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP(n_embd)


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=32, n_layer=4, n_embd=32, n_head=4, residual="standard",
                 num_blocks=None):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        options = {} if num_blocks is None else {"num_blocks": num_blocks}
        self.residual = attnres.build_residual(residual, num_layers=n_layer, hidden_size=n_embd, **options)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        state = self.residual.start(self.wte(idx) + self.wpe(pos))
        for i, block in enumerate(self.h):
            h = self.residual.sublayer_input(2 * i, state)
            self.residual.after(2 * i, state, block.attn(block.ln_1(h)))
            h = self.residual.sublayer_input(2 * i + 1, state)
            self.residual.after(2 * i + 1, state, block.mlp(block.ln_2(h)))
        logits = self.lm_head(self.ln_f(self.residual.finish(state)))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def optimizer_for(model: GPT) -> torch.optim.AdamW:
    """Routing parameters (the scheme's) in their own group, without weight decay."""
    routing = {id(p) for p in model.residual.parameters()}
    rest = [p for p in model.parameters() if id(p) not in routing]
    return torch.optim.AdamW([{"params": rest, "weight_decay": 0.1},
                              {"params": list(model.residual.parameters()), "weight_decay": 0.0}], lr=3e-3)


VARIANTS = [("standard", None), ("full_attnres", None), ("block_attnres", 4), ("delta_attnres", None),
            ("delta_block", 4)]


@pytest.mark.parametrize("residual, num_blocks", VARIANTS)
def test_a_nanogpt_style_model_trains_with_every_variant(residual, num_blocks):
    torch.manual_seed(0)
    model = GPT(residual=residual, num_blocks=num_blocks)
    optimizer = optimizer_for(model)
    data = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(25):
        _, loss = model(data[:, :-1], data[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 1.0
    queries = [router.query for router in model.residual.routers]
    assert (len(queries) > 0) == (residual != "standard")
    assert all(bool(q.any()) for q in queries[2:])  # routing was trained (queries start at zero)


def test_standard_is_nanogpts_own_residual():
    torch.manual_seed(0)
    model = GPT(residual="standard").eval()
    idx = torch.randint(0, 64, (2, 16))
    x = model.wte(idx) + model.wpe(torch.arange(16))
    for block in model.h:  # nanoGPT's Block.forward, written out
        x = x + block.attn(block.ln_1(x))
        x = x + block.mlp(block.ln_2(x))
    assert torch.equal(model(idx)[0], model.lm_head(model.ln_f(x)))


@pytest.mark.parametrize("residual, num_blocks", [("full_attnres", None), ("block_attnres", 4),
                                                  ("delta_attnres", None)])
def test_function_preserving_variants_start_as_the_standard_model(residual, num_blocks):
    """Zero queries: uniform weights; LayerNorm is scale-invariant, so these variants start as the
    standard model (method §4), up to the norm's eps. Delta Block does not (and is not checked)."""
    torch.manual_seed(0)
    standard = GPT(residual="standard").eval()
    routed = GPT(residual=residual, num_blocks=num_blocks).eval()
    routed.load_state_dict(standard.state_dict(), strict=False)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(routed(idx)[0], standard(idx)[0], rtol=1e-3, atol=1e-3)


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"residual_options.num_blocks is required for residual='block_attnres'.*"
                                         r"\[1, 2, 3, 4, 8\]"):
        attnres.build_residual("block_attnres", num_layers=4, hidden_size=32)
    with pytest.raises(ValueError, match=r"routing_impl must be one of"):
        attnres.build_residual("full_attnres", num_layers=4, hidden_size=32, routing_impl="fast")
