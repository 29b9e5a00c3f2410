"""Memory-lean routing in plain PyTorch: two custom ops with hand-written backward passes.

Why: the reference path stacks the normalised keys of every source at every router, and autograd
keeps them (and fp32 copies of bf16 sources) for backward: O(n) full-size tensors per router, which
makes Full and Delta AttnRes O(L^2 B T D) in activation memory. Here

  - each source's inverse RMS is computed once (`inv_rms`), whichever routers read it later;
    RMSNorm_g(v) . w = inv_rms(v) * (v . (w * g)), so a router needs only its effective query w * g;
  - `route_sources` takes the sources as a list (never stacked) and saves only references to its
    inputs and per-token scalars (the softmax weights); normalised keys are recomputed in backward.

Both are `fast_op.FastOp`s, three forms of one description. Under `torch.compile`, when a gradient
is needed, they are `torch.library.custom_op`s with fake implementations, so models trace through
them without graph breaks; without one (a compiled decode step) their plain forward is traced, and
inductor fuses it into the graph's kernels. In eager mode the same forward and backward functions
run through a `torch.autograd.Function` (and directly when no gradient is needed): the custom-op
dispatcher costs about 0.25 ms a call in Python, which would dominate decoding one token at a time.
Both work under activation checkpointing. Statistics are fp32 (float64 for float64 inputs, for
gradcheck); autocast is off inside.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnres.common.precision import autocast_off
from attnres.routing.fast_op import FastOp


def compute_dtype(sources: list[Tensor]) -> tuple[torch.dtype, torch.dtype]:
    """(output dtype = the sources' promoted dtype, compute dtype = that promoted with fp32)."""
    out = sources[0].dtype
    for v in sources[1:]:
        out = torch.promote_types(out, v.dtype)
    return out, torch.promote_types(out, torch.float32)


# ---------------------------------------------------------------- inverse RMS of one source

def _inv_rms_forward(source: Tensor, eps: float) -> Tensor:
    compute = torch.promote_types(source.dtype, torch.float32)
    with autocast_off(source.device):
        norm = torch.linalg.vector_norm(source, dim=-1, dtype=compute)  # no fp32 copy of the source
        return torch.rsqrt(norm * norm / source.shape[-1] + eps)


def _inv_rms_backward(source: Tensor, r: Tensor, grad: Tensor) -> Tensor:
    scale = grad * r.pow(3) / -source.shape[-1]  # d r / d v = -r^3 v / D
    return (scale.unsqueeze(-1) * source.to(r.dtype)).to(source.dtype)


def _inv_rms_fake(source: Tensor, eps: float) -> Tensor:
    return source.new_empty(source.shape[:-1], dtype=torch.promote_types(source.dtype, torch.float32))


_inv_rms = FastOp("attnres::inv_rms", _inv_rms_forward, fake=_inv_rms_fake,
                  save=lambda inputs, output: (inputs[0], output),
                  backward=lambda saved, grad: (_inv_rms_backward(*saved, grad), None))


def inv_rms(source: Tensor, eps: float) -> Tensor:
    """rsqrt(mean(v^2) + eps) over the last dim: (B, T, D) -> (B, T) in fp32 (float64 for float64).

    Saves only a reference to `source` and the (B, T) result for backward.
    """
    return _inv_rms(source, eps)


# ---------------------------------------------------------------- S routers over n shared sources

# A compiled step with this many token rows or fewer (decoding: one per sequence) computes the logits
# as a product and a sum, which inductor fuses with the softmax; a matrix product would stay one
# extern MKL call per source, with the wrapper's buffers around it (docs/explanation/fast-paths.md).
FEW_ROWS = 16


def source_logits(rows: Tensor, queries: Tensor) -> Tensor:
    """<q_s, v_t> for rows (N, D) and queries (S, D) -> (N, S)."""
    if rows.shape[0] <= FEW_ROWS and torch.compiler.is_compiling():
        return (rows.unsqueeze(1) * queries).sum(-1)
    return rows @ queries.T


def _route_forward(queries: Tensor, sources: list[Tensor], inv: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    out_dtype, compute = compute_dtype(sources)
    num_queries, width = queries.shape
    batch_shape = sources[0].shape[:-1]
    with autocast_off(sources[0].device):
        q = queries.to(compute)
        logits = torch.stack([source_logits(v.reshape(-1, width).to(compute), q) * r.reshape(-1, 1).to(compute)
                              for v, r in zip(sources, inv)], dim=-1)  # (BT, S, n): per-token scalars
        weights = torch.softmax(logits, dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
        per_source = weights.permute(2, 1, 0).unsqueeze(-1)  # (n, S, BT, 1), a view
        mixed = per_source[0] * sources[0].reshape(1, -1, width)
        for i in range(1, len(sources)):
            mixed.addcmul_(per_source[i], sources[i].reshape(1, -1, width))
    return (mixed.to(out_dtype).reshape(num_queries, *batch_shape, width),
            lse.T.reshape(num_queries, *batch_shape),
            weights.transpose(0, 1).reshape(num_queries, *batch_shape, len(sources)))


def _route_backward(queries: Tensor, weights: Tensor, sources: list[Tensor], inv: list[Tensor],
                    grad_mixed: Tensor | None, grad_lse: Tensor | None, grad_weights: Tensor | None):
    """Gradients w.r.t. (queries, sources, inv) from the saved weights; keys are recomputed."""
    _, compute = compute_dtype(sources)
    num_queries, width = queries.shape
    alpha = weights.reshape(num_queries, -1, len(sources)).to(compute)  # (S, BT, n)
    q = queries.to(compute)
    with autocast_off(queries.device):
        g = None if grad_mixed is None else grad_mixed.reshape(num_queries, -1, width).to(compute)
        dalpha = torch.zeros_like(alpha) if grad_weights is None else \
            grad_weights.reshape(alpha.shape).to(compute).clone()
        keys = [v.reshape(-1, width).to(compute) for v in sources]  # transient casts, freed per call
        if g is not None:
            for i, v in enumerate(keys):
                dalpha[:, :, i] += torch.linalg.vecdot(g, v)  # (einsum was slower here)
        dlogits = alpha * (dalpha - (alpha * dalpha).sum(-1, keepdim=True))
        if grad_lse is not None:
            dlogits = dlogits + grad_lse.reshape(num_queries, -1, 1).to(compute) * alpha
        grad_q = torch.zeros_like(q)
        grad_sources, grad_inv = [], []
        for i, (v, r, source) in enumerate(zip(keys, inv, sources)):
            dlogit_r = dlogits[:, :, i] * r.reshape(1, -1).to(compute)  # (S, BT)
            grad_q += dlogit_r @ v
            grad_inv.append((dlogits[:, :, i] * (q @ v.T)).sum(0).reshape(r.shape).to(r.dtype))
            grad_v = dlogit_r.T @ q
            if g is not None:
                grad_v += (alpha[:, :, i].unsqueeze(-1) * g).sum(0)
            grad_sources.append(grad_v.reshape(source.shape).to(source.dtype))
    return grad_q.to(queries.dtype), grad_sources, grad_inv


def _route_fake(queries: Tensor, sources: list[Tensor], inv: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    out_dtype, compute = compute_dtype(sources)
    shape = (queries.shape[0], *sources[0].shape[:-1])
    return (sources[0].new_empty((*shape, queries.shape[1]), dtype=out_dtype),
            sources[0].new_empty(shape, dtype=compute),
            sources[0].new_empty((*shape, len(sources)), dtype=compute))


def _route_save(inputs, output) -> tuple:
    queries, sources, inv = inputs
    return queries, output[2], sources, inv  # references and per-token weights only


_route = FastOp("attnres::route_sources", _route_forward, fake=_route_fake, save=_route_save,
                backward=lambda saved, *grads: _route_backward(*saved, *grads), materialize_grads=False)


def route_sources(queries: Tensor, sources: list[Tensor], inv: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """S routers attending over the same n sources, reading each source once per pass.

    queries (S, D): effective queries w * g; sources: n tensors (B, T, D); inv: n tensors (B, T)
    from `inv_rms`. logits[s, i] = inv_i * <queries_s, v_i>, statistics in fp32.
    Returns mixed (S, B, T, D) in the sources' promoted dtype, lse (S, B, T) = logsumexp over i,
    weights (S, B, T, n) = softmax over i; lse and weights fp32. Backward keeps the weights and
    references to the inputs, nothing else.
    """
    return _route(queries, list(sources), list(inv))
