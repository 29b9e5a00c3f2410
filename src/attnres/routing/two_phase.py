"""Two-phase routing (method §5): route a group of static queries over shared sources in one call,
then merge each router's result with the sources that came later, by online softmax.

Phase 1 (`route_group`) reads each shared source once for the whole group and keeps, per router, the
weighted sum, the log-sum-exp of its logits and its weights. Phase 2 (`merge_sources`) folds the
later sources into one router's phase-1 result in one op: their logits, one `logaddexp`, and
per-token rescalings. The result is exactly softmax routing over all the sources; statistics stay in
fp32 (float64 for float64).

Groups are Block AttnRes's blocks (the later source is the partial block sum) and, for the
per-sub-layer variants, chunks of C consecutive routers (the later sources are the sub-layer outputs
produced inside the chunk so far), which turns O(L^2) source reads into O(L^2 / C + L C).

What phase 2 keeps for backward: its output and per-token scalars, with references to its sources,
never the phase-1 mixture. The gradient of the phase-1 log-sum-exp needs <grad, mixture>, which
follows from the output: d out / d lse_1 = sum_i take_i (out - v_i) (see `_merge_backward`). In
"replace" routing the output is the next sub-layer's input, which its norm saves anyway, so a chunk
costs no activation memory beyond what the lean path keeps; in "add" routing it is one (B, T, D) per router.

Phase 2 has three implementations of the same function: `_merge_forward` / `_merge_backward` here
(PyTorch ops, any device; a `fast_op.FastOp` like lean's ops), with impl "fused" on CPU the C++ kernel
`fused_cpu.merge_sources_fused`, and in a compiled graph without gradients (decoding) `_merge_in_graph`,
one softmax in the fewest ops, which inductor fuses with its neighbours ("fused" and "lean" alike).
Why the kernel: the PyTorch version is a dozen small ops, each reading or writing a (B, T, D)
tensor (the dot products, each `addcmul_`, the fp32 copies of bf16 sources, then backward's dot
products and d sources), so a merge went through memory several times per source; at small widths
the op count itself dominated chunked routing (docs/explanation/fast-paths.md). The kernel reads the mixture and each
source row once per token (and writes out once), keeping the row in L1 between its dot products and
the weighted sum; with no inv given it computes the sources' inverse RMS in that same pass, so the
scheme runs no `inv_rms` under "fused" (neither for the partial block sum nor for completed sources).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnres.common.precision import autocast_off
from attnres.routing.fast_op import FastOp
from attnres.routing.fused_cpu import merge_sources_fused, route_sources_fused_split
from attnres.routing.lean import compute_dtype, inv_rms, source_logits
from attnres.routing.route import route_fast


@dataclass(frozen=True)
class RoutedPrefix:
    """One router's softmax routing over the first `num_sources` of its sources.

    query (D,): the router's effective query w * g as routed; mixed (B, T, D); lse (B, T) fp32, the
    log-sum-exp of the logits so far; weights (B, T, num_sources) fp32, or None when not kept.
    """

    query: Tensor
    mixed: Tensor
    lse: Tensor
    weights: Tensor | None
    num_sources: int


@dataclass(frozen=True)
class GroupRouting:
    """Phase 1 of a group of routers, kept for one forward pass (the scheme's per-pass cache).

    first: the index of the group's first router; prefixes: each router's `RoutedPrefix`, all over
    the same shared sources.
    """

    first: int
    prefixes: tuple[RoutedPrefix, ...]

    def prefix(self, index: int) -> RoutedPrefix:
        """The phase-1 result of router `first + index`."""
        return self.prefixes[index]


def route_group(first: int, queries: Tensor | list[Tensor], sources: list[Tensor], inv: list[Tensor] | None,
                impl: str, eps: float | None = None) -> GroupRouting:
    """Phase 1: the S routers first .. first + S - 1, with effective queries (S, D) (or S tensors
    (D,)), over n shared sources (B, T, D) whose inverse RMS (B, T) are `inv` (or None with `eps`:
    computed, by "fused" in its kernel), in one call of implementation `impl`."""
    each_query = list(queries)
    stacked = queries if isinstance(queries, Tensor) else torch.stack(each_query)
    if impl == "fused" and traced_without_grad():
        # Each router's results in buffers of their own, and its query as given (not a slice of the
        # stack): the merges inductor generates then read everything at offset 0, so every router's
        # code is one kernel, compiled once, not one per position in the group.
        mixed, lse, weights = route_sources_fused_split(stacked, sources, inv, eps=eps)
    else:
        # One mixture per router, not indexed from a stacked one: each select's backward would zero-fill
        # a whole (S, B, T, D) gradient and autograd would add the S of them (a fifth of Block AttnRes's
        # overhead). "fused" gives each its own tensor, whose gradient reaches the kernel as it is; the
        # others unbind, whose backward stacks the S gradients once.
        mixed, lse, weights = route_fast(stacked, sources, inv, impl, eps=eps, each=True)
        lse = lse.unbind()
    return GroupRouting(first, tuple(RoutedPrefix(*parts, len(sources))
                                     for parts in zip(each_query, mixed, lse, weights.unbind())))


def traced_without_grad() -> bool:
    """Whether this is a compiled graph without gradients (a decode step). There "fused" runs phase 1
    into per-router buffers, and merges with PyTorch ops that inductor fuses with the norms around
    them, where the C++ merge would be an extern call per router (its Python dispatch and a pass of
    its own)."""
    return torch.compiler.is_compiling() and not torch.is_grad_enabled()


# ---------------------------------------------------------------- phase 2: one op for all later sources

def _merge_forward(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor],
                   inv: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    width, compute = mixed.shape[-1], lse.dtype
    out_dtype, _ = compute_dtype([mixed, *sources])
    with autocast_off(mixed.device):  # fp32 logits, like the reference
        q = query.to(compute)
        logits = torch.stack([source_logits(v.reshape(-1, width).to(compute), q[None]).reshape(lse.shape)
                              * r.to(compute) for v, r in zip(sources, inv)], dim=-1)  # (B, T, j)
        total = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
        keep, take = torch.exp(lse - total), torch.exp(logits - total.unsqueeze(-1))
        out = keep.unsqueeze(-1) * mixed.to(compute)
        for i, v in enumerate(sources):
            out.addcmul_(take[..., i, None], v)
    return out.to(out_dtype), total, keep, take


def _merge_backward(query: Tensor, out: Tensor, keep: Tensor, take: Tensor, sources: list[Tensor],
                    inv: list[Tensor], mixed_dtype: torch.dtype, grad_out: Tensor | None,
                    grad_total: Tensor | None, grad_keep: Tensor | None, grad_take: Tensor | None):
    """Gradients w.r.t. (mixed, lse, query, sources, inv) from the saved output and weights.

    With p = (keep, take_1 .. take_j) the softmax over (lse, l_1 .. l_j) and out = keep * mixed +
    sum_i take_i v_i:  d l_i = take_i (<g, v_i> - <g, out>) + take_i * g_total,
    d lse = sum_i take_i (<g, out> - <g, v_i>) + keep * g_total, d mixed = keep * g; the recorded
    weights p add their softmax backward p * (g_p - <p, g_p>) to the logits (lse included).
    """
    compute, width = keep.dtype, out.shape[-1]
    with autocast_off(out.device):
        q = query.to(compute)
        g = None if grad_out is None else grad_out.to(compute)
        d_logits = torch.zeros_like(take)
        if g is not None:
            g_out = torch.linalg.vecdot(g, out.to(compute))
            for i, v in enumerate(sources):
                d_logits[..., i] = take[..., i] * (torch.linalg.vecdot(g, v.to(compute)) - g_out)
        d_lse = -d_logits.sum(-1)  # a softmax's logit gradients sum to zero: lse takes the rest
        if grad_total is not None:
            d_lse += keep * grad_total
            d_logits += take * grad_total.unsqueeze(-1)
        if grad_keep is not None or grad_take is not None:
            p = torch.cat([keep.unsqueeze(-1), take], dim=-1)
            g_p = torch.cat([(torch.zeros_like(keep) if grad_keep is None else grad_keep.to(compute)).unsqueeze(-1),
                             torch.zeros_like(take) if grad_take is None else grad_take.to(compute)], dim=-1)
            d_p = p * (g_p - (p * g_p).sum(-1, keepdim=True))
            d_lse += d_p[..., 0]
            d_logits += d_p[..., 1:]
        grad_q = torch.zeros_like(q)
        grad_sources, grad_inv = [], []
        g_rows = None if g is None else g.reshape(-1, width)
        for i, (v, r) in enumerate(zip(sources, inv)):
            v32 = v.reshape(-1, width).to(compute)
            d_raw = (d_logits[..., i] * r.to(compute)).reshape(-1)  # d loss / d <q, v_i>, per token
            grad_q += d_raw @ v32
            grad_inv.append((d_logits[..., i] * (v32 @ q).reshape(keep.shape)).to(r.dtype))
            grad_v = d_raw.unsqueeze(-1) * q
            if g is not None:
                grad_v = grad_v + take[..., i].reshape(-1, 1) * g_rows
            grad_sources.append(grad_v.reshape(v.shape).to(v.dtype))
        grad_mixed = None if g is None else (keep.unsqueeze(-1) * g).to(mixed_dtype)
    return grad_mixed, d_lse, grad_q.to(query.dtype), grad_sources, grad_inv


def _merge_fake(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor],
                inv: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out_dtype, _ = compute_dtype([mixed, *sources])
    return (mixed.new_empty(mixed.shape, dtype=out_dtype), torch.empty_like(lse), torch.empty_like(lse),
            lse.new_empty((*lse.shape, len(sources))))


def _merge_save(inputs, output) -> tuple:
    mixed, _, query, sources, inv = inputs
    out, _, keep, take = output
    return query, out, keep, take, sources, inv, mixed.dtype  # never the mixture


_merge = FastOp("attnres::merge_sources", _merge_forward, fake=_merge_fake, save=_merge_save,
                backward=lambda saved, *grads: _merge_backward(*saved, *grads), materialize_grads=False)


class _MergeSources:
    """The eager autograd form, called as before `FastOp` (tests/routing/test_fused_cpu.py compares
    the fused merge with it): apply(mixed, lse, query, j, *sources, *inv)."""

    @staticmethod
    def apply(mixed: Tensor, lse: Tensor, query: Tensor, num_sources: int, *tensors: Tensor):
        return _merge.autograd(mixed, lse, query, list(tensors[:num_sources]), list(tensors[num_sources:]))


def merge_sources(prefix: RoutedPrefix, sources: list[Tensor], inv: list[Tensor] | None,
                  need_weights: bool = True, impl: str = "lean", eps: float | None = None) -> RoutedPrefix:
    """Phase 2: softmax routing over prefix's sources plus `sources` (j tensors (B, T, D), j >= 1,
    with their inverse RMS `inv`, j tensors (B, T), or None with `eps`), from the prefix alone.

    The new logits are inv_i * <query, v_i> in fp32, as the reference computes keys. impl "fused"
    (CPU tensors): the C++ kernel, which computes a missing inv in its pass over the rows; any other
    implementation name: PyTorch ops (inv_rms first when inv is None); "fused" and "lean" in a compiled
    graph without gradients: `_merge_in_graph`. Returns the routing over
    num_sources + j sources: mixed (B, T, D) in the promoted dtype of the prefix's mixture and the
    sources; weights (B, T, n + j) fp32 when need_weights and the prefix kept its weights, else
    None. Backward keeps the output, per-token scalars and references (module docstring).
    """
    if not sources:
        raise ValueError("merge_sources needs at least one later source; with none the prefix is the routing")
    if inv is None and eps is None:
        raise ValueError("merge_sources needs inv, or eps to compute it")
    sources = list(sources)
    if traced_without_grad() and impl in ("fused", "lean"):
        out, total, keep, take = _merge_in_graph(prefix.mixed, prefix.lse, prefix.query, sources, inv, eps)
        return _merged(prefix, out, total, keep, take, need_weights)
    if impl == "fused":
        out, total, keep, take = merge_sources_fused(prefix.mixed, prefix.lse, prefix.query, sources, inv, eps=eps)
        return _merged(prefix, out, total, keep, take, need_weights)
    inv = [inv_rms(v, eps) for v in sources] if inv is None else list(inv)
    out, total, keep, take = _merge(prefix.mixed, prefix.lse, prefix.query, sources, inv)
    return _merged(prefix, out, total, keep, take, need_weights)


def _merge_in_graph(mixed: Tensor, lse: Tensor, query: Tensor, sources: list[Tensor], inv: list[Tensor] | None,
                    eps: float | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`_merge_forward` in the fewest ops, for a compiled step without gradients: one softmax over
    (lse, l_1 .. l_j), so inductor fuses the merge, the missing inverse RMS and the next norm into one
    kernel per sub-layer, and compiles few nodes. What the step does not read (total, the weights) is
    dropped from the graph."""
    out_dtype, _ = compute_dtype([mixed, *sources])
    compute = lse.dtype
    with autocast_off(mixed.device):
        q = query.to(compute)
        rows = [v.to(compute) for v in sources]
        scale = [r.to(compute) for r in inv] if inv is not None else \
            [torch.rsqrt(v.square().mean(-1) + eps) for v in rows]
        logits = torch.stack([lse, *[(v * q).sum(-1) * r for v, r in zip(rows, scale)]], dim=-1)
        weights = torch.softmax(logits, dim=-1)
        out = weights[..., :1] * mixed.to(compute)
        for i, v in enumerate(rows):
            out = out + weights[..., i + 1:i + 2] * v
    return out.to(out_dtype), torch.logsumexp(logits, dim=-1), weights[..., 0], weights[..., 1:]


def _merged(prefix: RoutedPrefix, out: Tensor, total: Tensor, keep: Tensor, take: Tensor,
            need_weights: bool) -> RoutedPrefix:
    """The routing a merge's (out, total, keep, take) give; take (B, T, j) extends the recorded weights."""
    weights = None
    if need_weights and prefix.weights is not None:
        weights = torch.cat([prefix.weights * keep.unsqueeze(-1), take], dim=-1)
    return RoutedPrefix(prefix.query, out, total, weights, prefix.num_sources + take.shape[-1])


def merge_remaining(prefix: RoutedPrefix, sources: list[Tensor], eps: float, inv: list[Tensor] | None = None,
                    need_weights: bool = True, impl: str = "lean") -> RoutedPrefix:
    """Routing over all of `sources` (n + j tensors (B, T, D)) from the phase-1 prefix over the first n:
    the prefix itself when j = 0, else `merge_sources` over the last j with implementation `impl`.
    Their inv_rms come from `inv` (B, T each, for the first len(inv) sources, e.g. the scheme's cache
    of completed ones); the missing ones are computed, by the kernel itself in its pass for "fused"."""
    later = list(sources[prefix.num_sources:])
    if not later:
        # A mixture that is a view of its whole group's phase-1 result (always so when compiling):
        # whatever saves it for backward (the next sub-layer's norm) would keep all S of them alive,
        # so it gets its own copy.
        shared = torch.compiler.is_compiling() or prefix.mixed._is_view()
        return replace(prefix, mixed=prefix.mixed.clone()) if torch.is_grad_enabled() and shared else prefix
    known = list(inv[prefix.num_sources:]) if inv is not None else []
    # None: merge_sources computes them all (the fused kernel in the pass that reads the rows anyway).
    later_inv = known + [inv_rms(v, eps) for v in later[len(known):]] if known else None
    return merge_sources(prefix, later, later_inv, need_weights, impl, eps)
