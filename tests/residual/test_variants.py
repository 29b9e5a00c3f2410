"""Each variant's logits against an independent step-by-step reference written from method §3.

The reference below shares no code with attnres: it reads the model's parameters by name and
recomputes everything (RMSNorm, rotary embedding, attention, SwiGLU, routing, the residual
bookkeeping) with plain tensor operations in float64. Its standard path is checked against
Hugging Face's Qwen3 in tests/model/test_decoder.py through the library model.
"""

import math

import pytest
import torch

from attnres import AttnResLM, ModelConfig


def rmsnorm(x, gain, eps):
    return gain * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rotate(x, positions, theta):
    hd = x.shape[-1]
    inv_freq = (1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))).double()
    angle = positions[:, None].double() * inv_freq[None]
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(p, pre, x, cfg):
    b, t, _ = x.shape
    h, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = rmsnorm((x @ p[pre + "q_proj.weight"].T).view(b, t, h, hd), p[pre + "q_norm.weight"], cfg.norm_eps)
    k = rmsnorm((x @ p[pre + "k_proj.weight"].T).view(b, t, kvh, hd), p[pre + "k_norm.weight"], cfg.norm_eps)
    v = (x @ p[pre + "v_proj.weight"].T).view(b, t, kvh, hd)
    pos = torch.arange(t)
    q, k = rotate(q.transpose(1, 2), pos, cfg.rope_theta), rotate(k.transpose(1, 2), pos, cfg.rope_theta)
    v = v.transpose(1, 2)
    out = torch.zeros(b, h, t, hd, dtype=x.dtype)
    for head in range(h):
        kv = head // (h // kvh)
        scores = q[:, head] @ k[:, kv].transpose(-1, -2) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out[:, head] = scores.softmax(-1) @ v[:, kv]
    return out.transpose(1, 2).reshape(b, t, h * hd) @ p[pre + "o_proj.weight"].T


def mlp(p, pre, x):
    gate, up = x @ p[pre + "gate_proj.weight"].T, x @ p[pre + "up_proj.weight"].T
    return (gate * torch.sigmoid(gate) * up) @ p[pre + "down_proj.weight"].T


def sublayer(p, s, h, cfg):
    """delta_s = f_s(Norm_s(h)): even s attention, odd s MLP."""
    pre = f"layers.{s // 2}."
    if s % 2 == 0:
        return attention(p, pre + "self_attn.", rmsnorm(h, p[pre + "input_layernorm.weight"], cfg.norm_eps), cfg)
    return mlp(p, pre + "mlp.", rmsnorm(h, p[pre + "post_attention_layernorm.weight"], cfg.norm_eps))


def route(p, r, sources, eps):
    """R(w, g; V_1..V_n) = sum_i softmax_i(w . RMSNorm_g(V_i)) V_i, times the gate if any."""
    w, g = p[f"residual.routers.{r}.query"], p[f"residual.routers.{r}.key_norm.weight"]
    z = torch.stack([(rmsnorm(v, g, eps) * w).sum(-1) for v in sources], -1)
    alpha = z.softmax(-1)
    out = sum(alpha[..., i, None] * v for i, v in enumerate(sources))
    return p.get(f"residual.routers.{r}.gate", 1.0) * out


def stream_coefficients(p, pre, cfg, streams):
    """(a_pre[j], a_post[k], A_res[j][k]) per token, (B, T) each, for n streams X_j (B, T, D), method §7.3."""
    n, eps = len(streams), cfg.norm_eps
    if cfg.residual == "hyper_connections":                  # Zhu et al.: static + tanh-gated corrections
        a_pre, a_post, a_res = p[pre + "pre"], p[pre + "post"], p[pre + "res"]
        if not cfg.residual_options.dynamic:
            ones = torch.ones(streams[0].shape[:-1], dtype=streams[0].dtype)
            return ([a_pre[j] * ones for j in range(n)], [a_post[k] * ones for k in range(n)],
                    [[a_res[j, k] * ones for k in range(n)] for j in range(n)])
        sa, sb = p[pre + "alpha_scale"], p[pre + "beta_scale"]
        bars = [rmsnorm(x, p[pre + "norm_weight"], eps) for x in streams]
        return ([a_pre[j] + sa * torch.tanh(bars[j] @ p[pre + "pre_proj"]) for j in range(n)],
                [a_post[k] + sb * torch.tanh(bars[k] @ p[pre + "post_proj"]) for k in range(n)],
                [[a_res[j, k] + sa * torch.tanh(bars[j] @ p[pre + "res_proj"][:, k]) for k in range(n)]
                 for j in range(n)])
    flat = torch.cat(streams, -1)                             # mHC: one map of the normalised flattened streams
    flat = flat / torch.sqrt((flat * flat).mean(-1, keepdim=True) + eps)
    m = flat @ p[pre + "fn"].T + 0 * flat[..., :1]
    scale, base = p[pre + "scale"], p[pre + "base"]
    a_pre = [torch.sigmoid(m[..., j] * scale[0] + base[j]) + 1e-6 for j in range(n)]
    a_post = [2 * torch.sigmoid(m[..., n + k] * scale[1] + base[n + k]) for k in range(n)]
    logits = [[m[..., 2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k] for k in range(n)] for j in range(n)]
    a = [[None] * n for _ in range(n)]
    for j in range(n):                                        # softmax over k of row j, + eps
        top = torch.stack(logits[j]).amax(0)
        total = sum(torch.exp(logits[j][k] - top) for k in range(n))
        for k in range(n):
            a[j][k] = torch.exp(logits[j][k] - top) / total + 1e-6
    for it in range(cfg.residual_options.sinkhorn_iters):                   # columns; then rows and columns
        if it > 0:
            for j in range(n):
                row = sum(a[j][k] for k in range(n)) + 1e-6
                a[j] = [a[j][k] / row for k in range(n)]
        for k in range(n):
            col = sum(a[j][k] for j in range(n)) + 1e-6
            for j in range(n):
                a[j][k] = a[j][k] / col
    return a_pre, a_post, a


def reference_logits(p, cfg, ids):
    n = 2 * cfg.num_layers
    e = p["embed_tokens.weight"][ids]
    eps = cfg.norm_eps
    if cfg.residual == "standard":
        x = e
        for s in range(n):
            x = x + sublayer(p, s, x, cfg)
        hidden = x
    elif cfg.residual == "full_attnres":                      # method §3.1
        v = [e]
        for s in range(n):
            h = e if s == 0 else route(p, s, v, eps)
            v.append(sublayer(p, s, h, cfg))
        hidden = route(p, n, v, eps)
    elif cfg.residual == "block_attnres":                     # method §3.2
        size = math.ceil(n / cfg.residual_options.num_blocks)
        b, partial = [e], None
        for s in range(n):
            j = s % size
            h = route(p, s, b if j == 0 else b + [partial], eps)
            delta = sublayer(p, s, h, cfg)
            partial = delta if j == 0 else partial + delta
            if j == size - 1 or s == n - 1:
                b.append(partial)
        hidden = route(p, n, b, eps)
    elif cfg.residual == "delta_attnres":                     # method §3.3
        x, deltas = e, []
        for s in range(n):
            delta = sublayer(p, s, x + route(p, s, [e] + deltas, eps), cfg)
            x = x + delta
            deltas.append(delta)
        hidden = x
    elif cfg.residual == "delta_block":                       # method §3.4 (+ §4 options)
        size = math.ceil(n / cfg.residual_options.num_blocks)
        x, block_deltas, start = e, [], None
        for s in range(n):
            j = s % size
            if j == 0:
                start = x                                     # explicit snapshot of x
            sources = [e] + block_deltas
            if cfg.residual_options.exact_conversion == "partial" and j > 0:
                sources = sources + [x - start]
            x = x + sublayer(p, s, x + route(p, s, sources, eps), cfg)
            if j == size - 1 or s == n - 1:
                block_deltas.append(x - start)                # Delta_k = x_end(k) - x_start(k)
        hidden = x
    elif cfg.residual == "denseformer":                       # method §7: k x p DenseFormer
        k, period = cfg.residual_options.dilation, cfg.residual_options.period
        states, y, m = [e], e, 0                              # states x_0 .. x_t; y: the stream
        for layer in range(1, cfg.num_layers + 1):
            x = y + sublayer(p, 2 * layer - 2, y, cfg)
            x = x + sublayer(p, 2 * layer - 1, x, cfg)       # x_t = Block_t(y_{t-1})
            states.append(x)
            if layer % period == 0:                          # y_t = sum_j alpha_{t,j} x_j, j = t mod k
                alpha = p[f"residual.routers.{m}.alpha"]
                y = sum(a * states[j] for a, j in zip(alpha, range(layer % k, layer + 1, k)))
                m += 1
            else:
                y = x
        hidden = y
    elif cfg.residual in ("hyper_connections", "mhc"):       # method §7.3: n residual streams
        streams = [e] * cfg.residual_options.streams
        for s in range(n):
            a_pre, a_post, a_res = stream_coefficients(p, f"residual.routers.{s}.", cfg, streams)
            delta = sublayer(p, s, sum(a_pre[j][..., None] * x for j, x in enumerate(streams)), cfg)
            streams = [sum(a_res[j][k][..., None] * x for j, x in enumerate(streams)) + a_post[k][..., None] * delta
                       for k in range(cfg.residual_options.streams)]
        if cfg.residual == "hyper_connections":               # the paper's output: the streams' sum
            hidden = sum(streams)
        else:                                                 # DeepSeek-V4's head collapse
            head = f"residual.routers.{n}."
            flat = torch.cat(streams, -1)
            flat = flat / torch.sqrt((flat * flat).mean(-1, keepdim=True) + eps)
            w = torch.sigmoid(flat @ p[head + "fn"].T * p[head + "scale"] + p[head + "base"]) + 1e-6
            hidden = sum(w[..., j, None] * x for j, x in enumerate(streams))
    return rmsnorm(hidden, p["norm.weight"], eps) @ p["lm_head.weight"].T


CASES = [
    ("standard", None, None), ("full_attnres", None, None),
    ("block_attnres", 1, None), ("block_attnres", 2, None), ("block_attnres", 3, None), ("block_attnres", 4, None),
    ("delta_attnres", None, None),
    ("delta_block", 1, None), ("delta_block", 2, None), ("delta_block", 4, None),
    ("delta_block", 4, "gate"), ("delta_block", 4, "partial"), ("delta_block", 3, "partial"),
]


def make_model(residual, num_blocks, exact, num_layers=5, options=None, **overrides):
    """options: the variant's other residual_options; num_blocks and exact None: not given."""
    options = {**(options or {}), **{name: value for name, value in (("num_blocks", num_blocks),
                                                                      ("exact_conversion", exact)) if value is not None}}
    config = ModelConfig(vocab_size=61, hidden_size=24, num_layers=num_layers, num_heads=4, num_kv_heads=2,
                         intermediate_size=40, residual=residual, residual_options=options,
                         rope_theta=10000.0, **overrides)
    return AttnResLM(config)


def randomise_routing(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in model.routers:
            if hasattr(router, "alpha"):  # DenseFormer's averaging weights: any sign, around the identity
                router.alpha.add_(0.5 * torch.randn(router.alpha.shape, generator=g))
                continue
            if router.mixes_streams:  # hyper-connections, mHC: every coefficient parameter moved
                for param in router.parameters():
                    param.add_(0.3 * torch.randn(param.shape, generator=g, dtype=param.dtype))
                continue
            router.query.copy_(torch.randn(router.query.shape, generator=g) * 2.0)
            router.key_norm.weight.copy_(1 + 0.5 * torch.randn(router.query.shape, generator=g))
            if router.gate is not None:
                router.gate.fill_(0.7 + 0.1 * torch.randn((), generator=g).item())


@pytest.mark.parametrize("residual, num_blocks, exact", CASES)
def test_logits_match_independent_reference(residual, num_blocks, exact):
    torch.manual_seed(0)
    model = make_model(residual, num_blocks, exact, init_std=0.2).double()  # 2L = 10; N=4: blocks 3,3,3,1
    assert_matches_reference(model)


def assert_matches_reference(model):
    """The model's float64 logits, with randomised routing, equal `reference_logits` to 1e-9."""
    randomise_routing(model)
    ids = torch.randint(0, 61, (2, 7))
    params = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        got = model(ids).logits
        expected = reference_logits(params, model.config, ids)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dilation, period", [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (5, 5)])
def test_denseformer_logits_match_independent_reference(dilation, period):
    torch.manual_seed(0)
    model = make_model("denseformer", None, None, init_std=0.2,
                       options={"dilation": dilation, "period": period}).double()
    assert len(model.routers) == 5 // period
    assert_matches_reference(model)


STREAM_CASES = [("hyper_connections", {}), ("hyper_connections", {"dynamic": False}),
                ("hyper_connections", {"streams": 3}), ("mhc", {}), ("mhc", {"streams": 2, "sinkhorn_iters": 5})]


@pytest.mark.parametrize("residual, options", STREAM_CASES, ids=lambda v: str(v))
def test_stream_variants_match_independent_reference(residual, options):
    """Hyper-connections and mHC (method §7.3), every coefficient parameter randomised, float64."""
    torch.manual_seed(0)
    model = make_model(residual, None, None, init_std=0.2, options=options).double()
    assert len(model.routers) == 2 * 5 + 1
    assert_matches_reference(model)


@pytest.mark.parametrize("dilation, period", [(1, 1), (2, 3)])
def test_denseformer_at_initialisation_is_the_standard_model_exactly(dilation, period):
    """alpha = (0, ..., 0, 1) after every averaging layer: the stream passes unchanged, bit for bit."""
    torch.manual_seed(0)
    standard = make_model("standard", None, None, init_std=0.2)
    dense = make_model("denseformer", None, None, options={"dilation": dilation, "period": period})
    missing, _ = dense.load_state_dict(standard.state_dict(), strict=False)
    assert missing and all(name.endswith(".alpha") for name in missing)
    dense.residual.routers.apply(lambda m: m.reset_parameters() if hasattr(m, "alpha") else None)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        assert torch.equal(dense(ids).logits, standard(ids).logits)


def test_routing_changes_the_output():
    """Guards the test above: random queries make a variant differ from standard."""
    torch.manual_seed(0)
    standard = make_model("standard", None, None, init_std=0.2).double()
    variant = make_model("delta_block", 4, None, init_std=0.2).double()
    variant.load_state_dict(standard.state_dict(), strict=False)
    randomise_routing(variant)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        assert (variant(ids).logits - standard(ids).logits).abs().max() > 1e-2


def test_block_attnres_with_2L_blocks_is_full_attnres():
    torch.manual_seed(0)
    full = make_model("full_attnres", None, None, init_std=0.2)
    block = make_model("block_attnres", 10, None, init_std=0.2)
    randomise_routing(full)
    assert block.load_state_dict(full.state_dict(), strict=True)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(block(ids).logits, full(ids).logits, rtol=0, atol=0)


# method §4: zero queries make these variants reproduce the standard model. RMSNorm's eps breaks
# the identity by ~eps * n^2 / mean(x^2); a tiny eps keeps that far below the tolerance.
PRESERVING = [("full_attnres", None, None), ("block_attnres", 2, None), ("block_attnres", 4, None),
              ("block_attnres", 1, None), ("delta_attnres", None, None),
              ("delta_block", 2, "gate"), ("delta_block", 4, "gate"),
              ("delta_block", 2, "partial"), ("delta_block", 4, "partial"), ("delta_block", 1, "partial"),
              ("hyper_connections", None, None)]


def zero_init_pair(residual, num_blocks, exact):
    torch.manual_seed(0)
    standard = make_model("standard", None, None, norm_eps=1e-12)
    with torch.no_grad():  # trained-looking norm gains
        for name, p in standard.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    variant = make_model(residual, num_blocks, exact, norm_eps=1e-12)
    variant.load_state_dict(standard.state_dict(), strict=False)
    ids = torch.randint(0, 61, (3, 9))
    with torch.no_grad():
        return standard(ids).logits, variant(ids).logits


@pytest.mark.parametrize("residual, num_blocks, exact", PRESERVING)
def test_zero_queries_reproduce_standard_logits(residual, num_blocks, exact):
    expected, got = zero_init_pair(residual, num_blocks, exact)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_blocks", [1, 2, 4])
def test_plain_delta_block_is_not_function_preserving(num_blocks):
    """method §4: h_s = x_s + mean(e, Delta_1, ...) is not a rescaling of x_s."""
    expected, got = zero_init_pair("delta_block", num_blocks, None)
    scale = expected.abs().max()
    assert (got - expected).abs().max() > 0.05 * scale
