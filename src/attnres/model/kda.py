"""Kimi Delta Attention (KDA), Kimi Linear's linear-attention layer: a gated delta rule whose decay is
per channel.

Per head, a state S (dk, dv) replaces the key/value cache. At each position t, with q_t, k_t
L2-normalised (q_t also scaled by dk^-1/2), a log-space decay g_t (dk,) <= 0 and a write strength
beta_t in (0, 1):

    S'_t = diag(exp(g_t)) S_{t-1}                        (forget, channel by channel)
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T          (delta rule: move k_t's read-out towards v_t)
    o_t  = S_t^T q_t

so S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T. Around that core (as
transformers' `KimiLinearDeltaAttention`): q, k, v are linear projections of x passed through one
causal depthwise convolution over time (SiLU after it); g_t = -exp(A_log) * softplus(f_b(f_a(x_t)) +
dt_bias) (a low-rank projection, per head and channel); beta_t = sigmoid(b_proj(x_t)) per head; the
output is RMS-normed per head, gated by sigmoid(g_b(g_a(x_t))) and projected by o_proj.

Two forms of the core compute the same thing: `kda_recurrent`, the step-by-step update (decoding),
and `kda_chunked`, which processes `chunk_size` positions at a time with matrix products and a
triangular solve (training, prefill). Parameter names are transformers' so a checkpoint's state dict
loads unchanged; the chunk size is a how-to-compute setting and is never stored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnres.common.checks import check_int
from attnres.model.attention_config import KDAConfig
from attnres.model.cache import RECURRENT_STATE, linear_states
from attnres.model.sublayer_protocols import TokenMixer
from attnres.norm import RMSNorm, unit_rms

# The chunk's (C, C, dk) decay tensors dominate a layer's time and memory and grow with C; fewer,
# larger chunks mean fewer sequential steps. 16 balanced the two on a CPU and needs the least memory of
# the sizes a GPU runs well; set `chunk_size` (larger on a GPU) to trade otherwise.
DEFAULT_CHUNK_SIZE = 16


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim. eps inside the square root (as FLA's kernels and
    transformers do), not F.normalize's max(norm, eps), so a zero vector stays zero."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule one position at a time.

    q, k (B, T, H, dk) (q already scaled, both normalised as the caller wants); v (B, T, H, dv);
    g (B, T, H, dk) log decays (<= 0); beta (B, T, H); initial_state (B, H, dk, dv) or None (zeros).
    Returns out (B, T, H, dv) and the final state (B, H, dk, dv), in the inputs' dtype.
    """
    b, t, h, dk = k.shape
    state = (initial_state if initial_state is not None
             else q.new_zeros(b, h, dk, v.shape[-1]))
    outs = []
    for i in range(t):
        k_i = k[:, i].unsqueeze(-2)  # (B, H, 1, dk)
        state = state * g[:, i].exp().unsqueeze(-1)
        correction = beta[:, i, :, None, None] * (v[:, i].unsqueeze(-2) - k_i @ state)  # (B, H, 1, dv)
        state = state + k_i.transpose(-1, -2) @ correction
        outs.append(q[:, i].unsqueeze(-2) @ state)
    return torch.cat(outs, dim=-2).transpose(1, 2), state


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                initial_state: torch.Tensor | None = None,
                chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule `chunk_size` positions at a time; same arguments and results as `kda_recurrent`.

    Within a chunk, with gamma_i = g_1 + ... + g_i (log decay from the chunk's start, per channel) and
    S_0 the state before it, the state after position i is
        S_i = diag(exp(gamma_i)) S_0 + sum_{j<=i} diag(exp(gamma_i - gamma_j)) k_j u_j^T
    for pseudo-values u_j fixed by the delta rule: (I + A) U = diag(beta) (V - (K * exp(gamma)) S_0) with
    A_ij = beta_i sum_c k_ic k_jc exp(gamma_ic - gamma_jc), j < i. One unit-lower-triangular solve
    gives U = W_v - W_k S_0 for every chunk at once; then out = P U + (Q * exp(gamma)) S_0 with
    P_ij = sum_c q_ic k_jc exp(gamma_ic - gamma_jc), j <= i, and the next state is
    S_C = diag(exp(gamma_C)) S_0 + (K * exp(gamma_C - gamma))^T U. Only that update runs in a Python
    loop over chunks; everything else is batched over all chunks.

    Numerics: every exponent is a difference gamma_i - gamma_j with i >= j (or gamma_i itself, i.e.
    i against the chunk's start), hence <= 0; exp(-gamma) is never formed, so no decay overflows.
    Memory: the pairwise decays are a (C, C, dk) tensor per chunk, B * H * T * C * dk values (two
    such tensors are kept for backward), which is why C is small. A chunk is min(chunk_size, T); T is
    padded with zeros to a multiple of it (k = 0, g = 0 leave the state as it is).
    """
    check_int(chunk_size, "kda_chunked chunk_size")
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    c = min(chunk_size, t)
    pad = -t % c
    n = (t + pad) // c
    # (B, T, H, .) -> (B, H, N, C, .): heads and chunks become batch dimensions.
    q, k, v, g = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)).reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v, g))
    beta = F.pad(beta.transpose(1, 2), (0, pad)).reshape(b, h, n, c, 1)

    gamma = g.cumsum(-2)  # (B, H, N, C, dk), <= 0, non-increasing along the chunk
    later = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)  # j > i
    # decay[..., i, j, :] = exp(gamma_i - gamma_j) for j <= i and 0 above the diagonal: masked to -inf
    # before exp, so the positive differences above the diagonal are never exponentiated. This is the
    # largest tensor here: filled and exponentiated in place (backward needs neither the difference nor
    # a copy), and the subtraction is an addition of -gamma, whose backward negates a (C, dk) sum
    # rather than the (C, C, dk) gradient.
    decay = (gamma.unsqueeze(-2) + (-gamma).unsqueeze(-3)).masked_fill_(later[:, :, None], float("-inf")).exp_()
    # One batched product gives both k_i . (decay_ij * k_j) and q_i . (decay_ij * k_j).
    pairs = (decay * k.unsqueeze(-3)) @ torch.stack((k, q), dim=-1)  # (B, H, N, C, C, 2)
    a = (beta * pairs[..., 0]).tril(-1)
    p = pairs[..., 1]  # already zero above the diagonal

    rhs = torch.cat((beta * v, beta * k * gamma.exp()), dim=-1)
    w = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # (I + A)^-1 rhs
    w_v, w_k = w.split((dv, dk), dim=-1)

    to_end = k * (gamma[..., -1:, :] - gamma).exp()  # k_j decayed from j to the chunk's end
    kept = gamma[..., -1, :].exp().unsqueeze(-1)  # (B, H, N, dk, 1): the decay across the whole chunk
    local = p @ w_v  # the output's part that does not depend on the state entering the chunk
    reads = q * gamma.exp() - p @ w_k  # (B, H, N, C, dk): the output reads reads @ S_0

    state = initial_state if initial_state is not None else q.new_zeros(b, h, dk, dv)
    starts = []
    # Per chunk, U = W_v - W_k S_0 and S_C = exp(gamma_C) * S_0 + to_end^T U: 2 C dk dv multiply-adds,
    # fewer than applying a precomputed (dk, dk) transition (dk^2 dv) for chunks shorter than dk / 2.
    # unbind rather than indexing by chunk: one unbind's backward is one stack, while each indexed
    # slice's backward would fill a zero tensor of the whole (B, H, N, ...) size, O(N^2) work in all.
    for w_v_i, w_k_i, to_end_i, kept_i in zip(w_v.unbind(2), w_k.unbind(2), to_end.unbind(2), kept.unbind(2)):
        starts.append(state)
        state = torch.addcmul(to_end_i.transpose(-1, -2) @ (w_v_i - w_k_i @ state), kept_i, state)
    out = local + reads @ torch.stack(starts, dim=2)
    return out.reshape(b, h, n * c, dv)[:, :, :t].transpose(1, 2), state


class ForgetGate(nn.Module):
    """Per-channel log decay g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias), (B, T, H, dk).

    A_log (1, 1, H, 1): one decay rate per head; dt_bias (H * dk,): per channel. Initialised as
    transformers (after FLA): A_log = log(U(1, 16)); dt_bias = softplus^-1(dt), dt log-uniform in
    [1e-3, 1e-1], so a fresh gate keeps exp(g) between about 0.2 and 1.
    """

    no_weight_decay = ("A_log",)  # a decay rate, not a weight: AdamW's decay would pull it to exp(0) = 1
    own_init = True  # init_module calls reset_parameters(); f_a_proj, f_b_proj are reached as nn.Linear

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, num_heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(num_heads * head_dim))
        self.A_log = nn.Parameter(torch.empty(1, 1, num_heads, 1))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A_log and dt_bias to their initial distributions (the projections are nn.Linear's own)."""
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log())
        dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt), stable for small dt

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x (B, T, D) -> g (B, T, H, dk) in `dtype`."""
        raw = self.f_b_proj(self.f_a_proj(x)).to(dtype) + self.dt_bias.to(dtype)
        raw = raw.view(*x.shape[:2], self.num_heads, self.head_dim)
        return -self.A_log.to(dtype).exp() * F.softplus(raw)


class GatedRMSNorm(RMSNorm):
    """RMSNorm over each head's dk channels, times a learnable gain and sigmoid(gate), in >= fp32
    (kept there, unlike RMSNorm, which returns x's dtype)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate (..., dim) -> (..., dim) in x's dtype promoted with fp32."""
        normed = unit_rms(x, self.eps)
        return normed * self.weight.to(normed.dtype) * torch.sigmoid(gate.to(normed.dtype))


class KimiDeltaAttention(TokenMixer):
    """Kimi Delta Attention: x (B, T, D) -> (B, T, D), causal, with a fixed-size state per head.

    H = kda.num_heads heads of width dk = dv = kda.head_dim. norm_eps: the output norm's eps (the
    model's rms_norm_eps in transformers). `chunk_size`: positions per chunk of the chunked core, a
    plain attribute (not in the state dict) that may be changed at any time.

    As a TokenMixer: a fixed-size recurrent state rather than a key/value cache (a cache's length is
    read from another layer), and a decode step that is not compiled yet.
    """

    cache_state = RECURRENT_STATE
    not_compiled = "Kimi Linear's latent or delta attention"

    def __init__(self, hidden_size: int, kda: KDAConfig, norm_eps: float = 1e-6) -> None:
        super().__init__()
        check_int(hidden_size, "KimiDeltaAttention hidden_size")
        kda = KDAConfig.from_dict(kda)
        self.num_heads, self.head_dim, self.kernel_size = kda.num_heads, kda.head_dim, kda.short_conv_kernel_size
        self.chunk_size = DEFAULT_CHUNK_SIZE
        d, h, hd = hidden_size, kda.num_heads, kda.head_dim
        width = h * hd
        self.q_proj = nn.Linear(d, width, bias=False)
        self.k_proj = nn.Linear(d, width, bias=False)
        self.v_proj = nn.Linear(d, width, bias=False)
        # One depthwise filter per channel of the concatenated q, k, v (transformers' layout: the
        # padding attribute is unused here, forward pads with the cached inputs or zeros itself).
        self.conv1d = nn.Conv1d(3 * width, 3 * width, kda.short_conv_kernel_size, groups=3 * width, bias=False,
                                padding=kda.short_conv_kernel_size - 1)
        self.forget_gate = ForgetGate(d, h, hd)
        self.b_proj = nn.Linear(d, h, bias=False)
        self.g_a_proj = nn.Linear(d, hd, bias=False)
        self.g_b_proj = nn.Linear(hd, width, bias=False)
        self.o_norm = GatedRMSNorm(hd, norm_eps)
        self.o_proj = nn.Linear(width, d, bias=False)

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token of mixing over positions, whatever `seq_len`: the delta rule's state
        read, update and output (6 H dk^2) and the q, k, v short convolutions (attnres.model.flops)."""
        h, hd = self.num_heads, self.head_dim
        return 6 * h * hd ** 2 + 2 * self.kernel_size * 3 * h * hd

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        """A fixed size whatever `positions`: the last kernel_size - 1 conv inputs of q, k, v and the
        (H, dk, dv) state, both in the compute dtype (`dtype` promoted with fp32)."""
        h, hd = self.num_heads, self.head_dim
        elements = batch * (3 * h * hd * (self.kernel_size - 1) + h * hd * hd)
        return elements * torch.promote_types(dtype, torch.float32).itemsize

    def forward(self, x: torch.Tensor, rope=None, cache=None, layer_idx: int = 0, mask: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D) in x's dtype. `rope` and `mask` are ignored (position is carried by the
        state; pads are zeroed instead of masked), taken so that every token mixer is called alike.

        cache: None, a transformers Cache (read through its linear-attention methods), or an object with
        `linear_state(layer_idx)` -> (conv_state, recurrent_state) or None (nothing yet), and
        `set_linear_state(layer_idx, conv_state, recurrent_state)`. conv_state
        (B, 3 * H * dk, short_conv_kernel_size - 1) holds the last conv inputs (zeros before the start),
        recurrent_state (B, H, dk, dv); both are in the compute dtype (x's promoted with fp32). The T
        new positions continue from the held state, and the state after them is stored.
        real: None, or (B, T) bool, True at real tokens. Pads' inputs
        are zeroed (as in transformers): their q, k, v are then zero and they write nothing into the
        state, so a left-padded row gives at its real positions what the row alone gives. A pad after
        a real token still decays the state and shows as zeros in the convolution's window.
        """
        cache = linear_states(cache)
        b, t, _ = x.shape
        h, hd, width = self.num_heads, self.head_dim, self.num_heads * self.head_dim
        compute = torch.promote_types(x.dtype, torch.float32)
        if real is not None:
            x = x.masked_fill(~real.bool()[..., None], 0.0)

        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1).transpose(1, 2)  # (B, 3HK, T)
        held = cache.linear_state(layer_idx) if cache is not None else None
        if held is None:
            past, state = mixed.new_zeros(b, 3 * width, self.kernel_size - 1), None
        else:
            past, state = held[0].to(mixed.dtype), held[1]
        window = torch.cat((past, mixed), dim=-1)  # (B, 3HK, K - 1 + T): the conv's left context first
        conv = F.conv1d(window, self.conv1d.weight, groups=3 * width)  # (B, 3HK, T), causal
        q, k, v = F.silu(conv.to(compute)).transpose(1, 2).split(width, dim=-1)
        q = l2norm(q.reshape(b, t, h, hd)) * hd ** -0.5
        k = l2norm(k.reshape(b, t, h, hd))
        v = v.reshape(b, t, h, hd)
        g = self.forget_gate(x, compute)
        beta = torch.sigmoid(self.b_proj(x).to(compute))
        if state is not None:
            state = state.to(compute)

        if t == 1:
            out, state = kda_recurrent(q, k, v, g, beta, state)
        else:
            out, state = kda_chunked(q, k, v, g, beta, state, self.chunk_size)
        if cache is not None:
            cache.set_linear_state(layer_idx, window[..., window.shape[-1] - (self.kernel_size - 1):].to(compute),
                                   state)

        gate = self.g_b_proj(self.g_a_proj(x)).view(b, t, h, hd)
        out = self.o_norm(out, gate).reshape(b, t, width)
        return self.o_proj(out.to(x.dtype))

