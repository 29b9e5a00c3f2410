"""Fused Triton routing kernel: S static queries against n sources, forward and backward.

Contract (the same one the memory-lean PyTorch op implements)::

    route_sources_triton(queries, sources, inv_rms) -> (mixed, lse, weights)
      queries: (S, D), any float dtype, used in fp32 (query * key_gain of each router)
      sources: n >= 1 tensors (B, T, D) (any leading shape (..., D) works); fp32 / bf16 / fp16, mixed
      inv_rms: n tensors (B, T); inv_rms[i] = rsqrt(mean(sources[i].float() ** 2, -1) + eps)
      logits[s, b, t, i] = inv_rms[i][b, t] * <queries[s], sources[i][b, t]>      (fp32)
      weights = softmax_i(logits) (S, B, T, n) fp32;  lse = logsumexp_i(logits) (S, B, T) fp32
      mixed[s] = sum_i weights[s, ..., i] * sources[i]   (fp32 accumulation), (S, B, T, D) in the
                 promoted dtype of the sources

Design
------
* Sources are never stacked. The kernel receives an int64 table of the sources' ``data_ptr()`` and
  an int32 table of their dtype kinds (0 fp32, 1 bf16, 2 fp16); inside the kernel the address is
  cast to a typed pointer (``tl.load(table + i).to(tl.pointer_type(...))``), branching on the kind
  at run time, so mixed-dtype sources are read in place without any cast copy. The inverse-RMS
  vectors and the source gradients are passed the same way. Sources must be contiguous; a
  non-contiguous one is made contiguous (a copy of that source only).
* Grid: one program per block of ``BLOCK_T`` tokens (tokens = B*T flattened). A program handles
  all S queries (padded to ``S_PAD``) and all n sources (padded to ``N_PAD``), holding the
  per-token scalars (logits, weights, ...) as (S_PAD, BLOCK_T, N_PAD) fp32 register tiles.
  D is tiled by ``BLOCK_D`` in two passes: pass 1 accumulates the logits over D tiles, the softmax
  is taken in registers, pass 2 re-reads the sources tile by tile and writes the mixture.
  Each source is thus read twice per forward call regardless of S.
* Backward is one kernel with the same tiling: pass 1 recomputes <q_s, v_i> and <g_s, v_i> over
  D tiles, forms dlogit in registers and writes d inv_rms; pass 2 writes d v_i and accumulates
  d queries over the program's tokens. Backward programs are persistent (each loops over several
  token blocks) so the per-program d queries partials, a (P, S, D) fp32 buffer, stay bounded;
  they are summed with torch.
* Saved for backward: the weights (S, B, T, n) fp32 (the tensor that is also returned, so no extra
  memory beyond it) plus references to queries, sources and inv_rms. Raw dot products are
  recomputed in backward (they cost no extra reads: the backward pass reads the sources anyway).
* Triton is imported lazily and the kernels are decorated with ``triton.jit`` on first use, so this
  module imports without Triton, and ``TRITON_INTERPRET=1`` only has to be set before the first
  call (not before import). The mode (interpreter or compiled) is fixed by that first call.

Limits: float64 sources are rejected (TypeError; use the PyTorch op, e.g. for gradcheck). Under the
interpreter the tensors must be on the CPU (the address tables are dereferenced on the host); in
compiled mode they must be CUDA tensors. The op is a plain autograd.Function that reads
``data_ptr()``, so torch.compile will not trace through it (expect a graph break), and it is not
twice differentiable. Only the Triton interpreter (CPU) has been exercised by the tests; the
compiled GPU path is written for it but has not been compiled or run on a GPU here.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence

import torch

from attnres.routing.lean import compute_dtype

__all__ = ["route_sources_triton", "triton_available"]

# Bound to triton.language by _kernels(); the kernel bodies below resolve `tl` from module globals.
tl = None

_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# Backward keeps one (S, D) fp32 d-queries partial per program; this bounds their total size.
_DQ_PARTIAL_BYTES = 64 * 2**20


def _interpret_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def triton_available() -> bool:
    """True when Triton imports and it can run here: a CUDA device, or TRITON_INTERPRET=1."""
    return _triton_importable() and (torch.cuda.is_available() or _interpret_on())


# ---------------------------------------------------------------------------------------------
# Kernel bodies, as plain Python functions. _kernels() decorates them with triton.jit on first use.
# ---------------------------------------------------------------------------------------------

def _py_load_src(addr, kind, offs, mask):
    """Load a tile from a source given as a raw address and a dtype kind; returns fp32."""
    if kind == 1:
        x = tl.load(addr.to(tl.pointer_type(tl.bfloat16)) + offs, mask=mask, other=0.0).to(tl.float32)
    elif kind == 2:
        x = tl.load(addr.to(tl.pointer_type(tl.float16)) + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(addr.to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
    return x


def _py_store_src(addr, kind, offs, val, mask):
    """Store an fp32 tile to a raw address of the given dtype kind."""
    if kind == 1:
        tl.store(addr.to(tl.pointer_type(tl.bfloat16)) + offs, val.to(tl.bfloat16), mask=mask)
    elif kind == 2:
        tl.store(addr.to(tl.pointer_type(tl.float16)) + offs, val.to(tl.float16), mask=mask)
    else:
        tl.store(addr.to(tl.pointer_type(tl.float32)) + offs, val, mask=mask)


def _py_load_rinv(rinv_tab, n, offs_t, t_mask, cols, BLOCK_T: tl.constexpr, N_PAD: tl.constexpr):
    """Gather inv_rms of all n sources for a token block into a (BLOCK_T, N_PAD) fp32 tile."""
    rinv = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)
    for i in range(n):
        addr = tl.load(rinv_tab + i).to(tl.pointer_type(tl.float32))
        r = tl.load(addr + offs_t, mask=t_mask, other=0.0)
        rinv += tl.where(cols[None, :] == i, r[:, None], 0.0)
    return rinv


def _py_fwd_kernel(q_ptr, src_tab, kind_tab, rinv_tab, mixed_ptr, lse_ptr, w_ptr,
                   S, N, D, n,
                   S_PAD: tl.constexpr, N_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs_t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    t_mask = offs_t < N
    offs_s = tl.arange(0, S_PAD)
    s_mask = offs_s < S
    cols = tl.arange(0, N_PAD)
    cols3 = cols[None, None, :]
    st_mask = s_mask[:, None] & t_mask[None, :]
    # (s, t) row offsets into the (S, N, ...) outputs
    st_offs = offs_s[:, None].to(tl.int64) * N + offs_t[None, :]

    # Pass 1: raw dot products <q_s, v_i> for every (s, t, i), accumulated over D tiles.
    dots = tl.zeros((S_PAD, BLOCK_T, N_PAD), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        d_mask = offs_d < D
        q = tl.load(q_ptr + offs_s[:, None] * D + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :],
                    other=0.0)
        v_offs = offs_t[:, None] * D + offs_d[None, :]
        v_mask = t_mask[:, None] & d_mask[None, :]
        for i in range(n):
            v = _load_src(tl.load(src_tab + i), tl.load(kind_tab + i), v_offs, v_mask)
            part = tl.sum(q[:, None, :] * v[None, :, :], axis=2)
            dots += tl.where(cols3 == i, part[:, :, None], 0.0)

    # Softmax over sources, in registers.
    rinv = _load_rinv(rinv_tab, n, offs_t, t_mask, cols, BLOCK_T, N_PAD)
    logits = tl.where(cols3 < n, dots * rinv[None, :, :], float("-inf"))
    m = tl.max(logits, axis=2)
    p = tl.exp(logits - m[:, :, None])
    total = tl.sum(p, axis=2)
    alpha = p / total[:, :, None]
    tl.store(lse_ptr + st_offs, m + tl.log(total), mask=st_mask)
    tl.store(w_ptr + st_offs[:, :, None] * n + cols3, alpha, mask=st_mask[:, :, None] & (cols3 < n))

    # Pass 2: mixed[s, t, d] = sum_i alpha[s, t, i] * v_i[t, d], one D tile at a time.
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        d_mask = offs_d < D
        v_offs = offs_t[:, None] * D + offs_d[None, :]
        v_mask = t_mask[:, None] & d_mask[None, :]
        acc = tl.zeros((S_PAD, BLOCK_T, BLOCK_D), dtype=tl.float32)
        for i in range(n):
            v = _load_src(tl.load(src_tab + i), tl.load(kind_tab + i), v_offs, v_mask)
            a = tl.sum(tl.where(cols3 == i, alpha, 0.0), axis=2)
            acc += a[:, :, None] * v[None, :, :]
        out_offs = st_offs[:, :, None] * D + offs_d[None, None, :]
        tl.store(mixed_ptr + out_offs, acc.to(mixed_ptr.dtype.element_ty),
                 mask=st_mask[:, :, None] & d_mask[None, None, :])


def _py_bwd_kernel(q_ptr, src_tab, kind_tab, rinv_tab, w_ptr, gm_ptr, gl_ptr, gw_ptr,
                   dsrc_tab, drinv_tab, dq_part_ptr,
                   S, N, D, n, iters,
                   HAS_GM: tl.constexpr, HAS_GL: tl.constexpr, HAS_GW: tl.constexpr,
                   S_PAD: tl.constexpr, N_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_s = tl.arange(0, S_PAD)
    s_mask = offs_s < S
    cols = tl.arange(0, N_PAD)
    cols3 = cols[None, None, :]

    for it in range(iters):
        blk = pid + it * nprog
        offs_t = (blk * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        t_mask = offs_t < N
        st_mask = s_mask[:, None] & t_mask[None, :]
        st_offs = offs_s[:, None].to(tl.int64) * N + offs_t[None, :]
        stn_mask = st_mask[:, :, None] & (cols3 < n)
        stn_offs = st_offs[:, :, None] * n + cols3
        alpha = tl.load(w_ptr + stn_offs, mask=stn_mask, other=0.0)

        # Pass 1: qv[s, t, i] = <q_s, v_i>, gv[s, t, i] = <g_s, v_i>.
        qv = tl.zeros((S_PAD, BLOCK_T, N_PAD), dtype=tl.float32)
        gv = tl.zeros((S_PAD, BLOCK_T, N_PAD), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            d_mask = offs_d < D
            q = tl.load(q_ptr + offs_s[:, None] * D + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :],
                        other=0.0)
            v_offs = offs_t[:, None] * D + offs_d[None, :]
            v_mask = t_mask[:, None] & d_mask[None, :]
            if HAS_GM:
                g = tl.load(gm_ptr + st_offs[:, :, None] * D + offs_d[None, None, :],
                            mask=st_mask[:, :, None] & d_mask[None, None, :], other=0.0).to(tl.float32)
            for i in range(n):
                v = _load_src(tl.load(src_tab + i), tl.load(kind_tab + i), v_offs, v_mask)
                part = tl.sum(q[:, None, :] * v[None, :, :], axis=2)
                qv += tl.where(cols3 == i, part[:, :, None], 0.0)
                if HAS_GM:
                    gpart = tl.sum(g * v[None, :, :], axis=2)
                    gv += tl.where(cols3 == i, gpart[:, :, None], 0.0)

        # Per-token scalars: dalpha, dlogit, d inv_rms.
        dalpha = gv
        if HAS_GW:
            dalpha += tl.load(gw_ptr + stn_offs, mask=stn_mask, other=0.0)
        centre = tl.sum(alpha * dalpha, axis=2)
        dlogit = alpha * (dalpha - centre[:, :, None])
        if HAS_GL:
            gl = tl.load(gl_ptr + st_offs, mask=st_mask, other=0.0)
            dlogit += gl[:, :, None] * alpha
        drinv = tl.sum(dlogit * qv, axis=0)  # (BLOCK_T, N_PAD)
        for i in range(n):
            addr = tl.load(drinv_tab + i).to(tl.pointer_type(tl.float32))
            tl.store(addr + offs_t, tl.sum(tl.where(cols[None, :] == i, drinv, 0.0), axis=1), mask=t_mask)
        rinv = _load_rinv(rinv_tab, n, offs_t, t_mask, cols, BLOCK_T, N_PAD)
        coef = dlogit * rinv[None, :, :]  # dlogit * inv_rms: the weight of q_s in d v_i, of v_i in d q_s

        # Pass 2: d v_i = sum_s alpha g_s + sum_s coef q_s;  d q_s += sum_{t,i} coef v_i.
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            d_mask = offs_d < D
            sd_mask = s_mask[:, None] & d_mask[None, :]
            q = tl.load(q_ptr + offs_s[:, None] * D + offs_d[None, :], mask=sd_mask, other=0.0)
            v_offs = offs_t[:, None] * D + offs_d[None, :]
            v_mask = t_mask[:, None] & d_mask[None, :]
            if HAS_GM:
                g = tl.load(gm_ptr + st_offs[:, :, None] * D + offs_d[None, None, :],
                            mask=st_mask[:, :, None] & d_mask[None, None, :], other=0.0).to(tl.float32)
            dq = tl.zeros((S_PAD, BLOCK_D), dtype=tl.float32)
            for i in range(n):
                v = _load_src(tl.load(src_tab + i), tl.load(kind_tab + i), v_offs, v_mask)
                c = tl.sum(tl.where(cols3 == i, coef, 0.0), axis=2)  # (S_PAD, BLOCK_T)
                dv = tl.sum(c[:, :, None] * q[:, None, :], axis=0)  # (BLOCK_T, BLOCK_D)
                if HAS_GM:
                    a = tl.sum(tl.where(cols3 == i, alpha, 0.0), axis=2)
                    dv += tl.sum(a[:, :, None] * g, axis=0)
                _store_src(tl.load(dsrc_tab + i), tl.load(kind_tab + i), v_offs, dv, v_mask)
                dq += tl.sum(c[:, :, None] * v[None, :, :], axis=1)
            # This program's own partial: read-modify-write with the same tile, no other writer.
            part_ptrs = dq_part_ptr + (pid * S + offs_s[:, None]).to(tl.int64) * D + offs_d[None, :]
            prev = tl.load(part_ptrs, mask=sd_mask, other=0.0)
            tl.store(part_ptrs, prev + dq, mask=sd_mask)


_load_src = _store_src = _load_rinv = None  # jitted helpers, bound by _kernels()


@functools.lru_cache(maxsize=None)
def _kernels():
    """Decorate the kernels with triton.jit (honouring TRITON_INTERPRET as set now); once per process."""
    global tl, _load_src, _store_src, _load_rinv
    try:
        import triton
        import triton.language as language
    except Exception as err:  # pragma: no cover - exercised only without triton
        raise RuntimeError("route_sources_triton needs Triton (`pip install triton`); it is not importable: "
                           f"{err}") from err
    tl = language
    _load_src = triton.jit(_py_load_src)
    _store_src = triton.jit(_py_store_src)
    _load_rinv = triton.jit(_py_load_rinv)
    return triton.jit(_py_fwd_kernel), triton.jit(_py_bwd_kernel)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _prev_pow2(x: int) -> int:
    return 1 << max(0, int(x).bit_length() - 1)


def _block_sizes(s_pad: int, n_pad: int, d: int, block_t: int | None, block_d: int | None) -> tuple[int, int]:
    """Tile sizes keeping the (S_PAD, BLOCK_T, N_PAD) and (S_PAD, BLOCK_T, BLOCK_D) register tiles bounded."""
    if block_t is None:
        block_t = min(32, max(1, _prev_pow2(2048 // (s_pad * n_pad)) if s_pad * n_pad <= 2048 else 1))
    if block_d is None:
        budget = max(1, 4096 // (s_pad * block_t))
        block_d = min(max(16, _prev_pow2(budget)), 256, max(16, _next_pow2(d)))
    for name, val in (("block_t", block_t), ("block_d", block_d)):
        if val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two, got {val}")
    return block_t, block_d


def _check_inputs(queries, sources, inv_rms):
    if len(sources) == 0:
        raise ValueError("route_sources_triton needs at least one source, got none")
    if len(inv_rms) != len(sources):
        raise ValueError(f"got {len(sources)} sources but {len(inv_rms)} inv_rms tensors")
    if queries.dim() != 2 or queries.shape[0] == 0 or queries.shape[1] == 0:
        raise ValueError(f"queries must be (S, D) with S, D >= 1, got shape {tuple(queries.shape)}")
    shape = sources[0].shape
    if len(shape) < 1 or shape[-1] != queries.shape[1]:
        raise ValueError(f"sources must be (..., D) with D = {queries.shape[1]}, got {tuple(shape)}")
    device = queries.device
    for i, (v, r) in enumerate(zip(sources, inv_rms)):
        if v.shape != shape:
            raise ValueError(f"source {i} has shape {tuple(v.shape)}, expected {tuple(shape)}")
        if v.dtype not in _KINDS:
            raise TypeError(f"source {i} has dtype {v.dtype}; the Triton router supports fp32, bf16 and fp16")
        if r.shape != shape[:-1]:
            raise ValueError(f"inv_rms {i} has shape {tuple(r.shape)}, expected {tuple(shape[:-1])}")
        if v.device != device or r.device != device:
            raise ValueError("queries, sources and inv_rms must all be on the same device")
    if device.type == "cuda" and _interpret_on():
        raise RuntimeError("under TRITON_INTERPRET=1 route_sources_triton needs CPU tensors: the kernels read the "
                           "sources through raw address tables, which the interpreter dereferences on the host")
    if device.type != "cuda" and not _interpret_on():
        raise RuntimeError(f"route_sources_triton runs on CUDA tensors (got {device}); set TRITON_INTERPRET=1 "
                           "before the first call to run it on CPU under the Triton interpreter")


def _on_device(device):
    """Launch on the tensors' CUDA device (Triton launches on the current one)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _ptr_table(tensors, device) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


class _RouteSources(torch.autograd.Function):

    @staticmethod
    def forward(ctx, queries, n, block_t, block_d, max_programs, *tensors):
        sources = [v.contiguous() for v in tensors[:n]]
        inv_rms = [r.to(torch.float32).contiguous() for r in tensors[n:]]
        s, d = queries.shape
        batch = sources[0].shape[:-1]
        tokens = sources[0].numel() // d
        device = queries.device
        q32 = queries.to(torch.float32).contiguous()
        out_dtype, _ = compute_dtype(sources)

        mixed = torch.empty(s, *batch, d, dtype=out_dtype, device=device)
        lse = torch.empty(s, *batch, dtype=torch.float32, device=device)
        weights = torch.empty(s, *batch, n, dtype=torch.float32, device=device)
        s_pad, n_pad = _next_pow2(s), _next_pow2(n)
        bt, bd = _block_sizes(s_pad, n_pad, d, block_t, block_d)
        fwd, _ = _kernels()
        src_tab = _ptr_table(sources, device)
        kind_tab = torch.tensor([_KINDS[v.dtype] for v in sources], dtype=torch.int32, device=device)
        rinv_tab = _ptr_table(inv_rms, device)
        if tokens > 0:
            with _on_device(device):
                fwd[(_cdiv(tokens, bt),)](q32, src_tab, kind_tab, rinv_tab, mixed, lse, weights,
                                         s, tokens, d, n,
                                         S_PAD=s_pad, N_PAD=n_pad, BLOCK_T=bt, BLOCK_D=bd)

        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q32, weights, *sources, *inv_rms)
        ctx.meta = (n, bt, bd, max_programs, queries.dtype, [r.dtype for r in tensors[n:]])
        return mixed, lse, weights

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mixed, g_lse, g_weights):
        n, bt, bd, max_programs, q_dtype, rinv_dtypes = ctx.meta
        q32, weights, *rest = ctx.saved_tensors
        sources, inv_rms = rest[:n], rest[n:]
        s, d = q32.shape
        batch = sources[0].shape[:-1]
        tokens = sources[0].numel() // d
        device = q32.device
        grads_src = [torch.empty_like(v) for v in sources]
        grads_rinv = [torch.empty(batch, dtype=torch.float32, device=device) for _ in range(n)]
        num_blocks = _cdiv(tokens, bt)
        cap = max(1, _DQ_PARTIAL_BYTES // max(1, s * d * 4))
        if max_programs is not None:
            cap = min(cap, max_programs)
        nprog = max(1, min(num_blocks, cap))
        iters = _cdiv(num_blocks, nprog)
        dq_part = torch.zeros(nprog, s, d, dtype=torch.float32, device=device)

        has_gm, has_gl, has_gw = g_mixed is not None, g_lse is not None, g_weights is not None
        gm = g_mixed.contiguous() if has_gm else q32  # a dummy pointer when absent
        gl = g_lse.to(torch.float32).contiguous() if has_gl else q32
        gw = g_weights.to(torch.float32).contiguous() if has_gw else q32
        _, bwd = _kernels()
        if tokens > 0:
            with _on_device(device):
                bwd[(nprog,)](q32, _ptr_table(sources, device),
                              torch.tensor([_KINDS[v.dtype] for v in sources], dtype=torch.int32, device=device),
                              _ptr_table(inv_rms, device), weights, gm, gl, gw,
                              _ptr_table(grads_src, device), _ptr_table(grads_rinv, device), dq_part,
                              s, tokens, d, n, iters,
                              HAS_GM=has_gm, HAS_GL=has_gl, HAS_GW=has_gw,
                              S_PAD=_next_pow2(s), N_PAD=_next_pow2(n), BLOCK_T=bt, BLOCK_D=bd)
        else:
            for g in grads_src:
                g.zero_()
            for g in grads_rinv:
                g.zero_()
        d_queries = dq_part.sum(0).to(q_dtype)
        grads_rinv = [g.to(dt) for g, dt in zip(grads_rinv, rinv_dtypes)]
        return (d_queries, None, None, None, None, *grads_src, *grads_rinv)


def route_sources_triton(queries: torch.Tensor, sources: Sequence[torch.Tensor], inv_rms: Sequence[torch.Tensor],
                         *, block_t: int | None = None, block_d: int | None = None,
                         max_programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route S static queries over n sources with the fused Triton kernel; see the module docstring.

    Returns (mixed (S, B, T, D) in the sources' promoted dtype, lse (S, B, T) fp32, weights (S, B, T, n) fp32).
    Differentiable w.r.t. queries, every source and every inv_rms. block_t / block_d (powers of two) and
    max_programs (backward persistent programs) override the tiling; they exist for tests and tuning.
    Runs on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before the first call.
    """
    if not _triton_importable():
        raise RuntimeError("route_sources_triton needs Triton, which is not installed (`pip install triton`); "
                           "use the PyTorch routing op instead")
    sources, inv_rms = list(sources), list(inv_rms)
    _check_inputs(queries, sources, inv_rms)
    return _RouteSources.apply(queries, len(sources), block_t, block_d, max_programs, *sources, *inv_rms)
