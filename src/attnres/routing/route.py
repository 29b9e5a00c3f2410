"""Choosing a routing implementation: the reference, the memory-lean op, the Triton kernel or the fused CPU op.

`IMPLS` is the one list of implementation names; configs and options validate against it.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from attnres.common.errors import InputError
from attnres.routing.fused_cpu import build_extension, fused_available, how_to_build, route_sources_fused, unavailable_reason
from attnres.routing.lean import inv_rms, route_sources
from attnres.routing.triton_route import route_sources_triton, triton_available

# How routers compute (the same function at different speeds): "auto" = the fused C++ op on CPU when its
# extension is built, else the memory-lean custom op (on every device); "reference" = the plain method §2
# code every path is tested against; "triton" only by name until it has been checked on a GPU.
IMPLS = ("auto", "reference", "lean", "triton", "fused")

# Whether "auto" picks the Triton kernel on CUDA. The kernel has only run under Triton's CPU
# interpreter, so a user's first GPU run is not to be its first test: set this to True once
# tools/benchmarks/gpu_check.sh has passed on a real GPU (it prints this instruction when it does).
TRITON_IN_AUTO = False


def resolve_impl(impl: str, device: torch.device, quiet: bool = False) -> str:
    """The implementation `impl` means on `device`.

    "auto" -> "lean" on CUDA (the ops PyTorch runs everywhere; "triton" once `TRITON_IN_AUTO` is set,
    outside torch.compile); "fused" on CPU when
    the fused extension is already built (auto never starts a build), in a compiled decode step too:
    there its kernels are single calls in the graph, which compiles in about half the time of the
    lean ops' plain PyTorch at up to 3 % more time per token (docs/explanation/fast-paths.md); else
    "lean". When "auto" takes "lean" on CPU only because the extension is not built, a warning says
    so once per process, naming how to build it (not under torch.compile, nor with `quiet`: for a
    caller that will not route with the result). An explicit "fused" builds the extension if needed.
    Raises InputError for an unknown name or an unusable "triton" or "fused" (without a compiler:
    one line naming what to install).
    """
    if impl not in IMPLS:
        raise InputError(f"routing_impl must be one of {list(IMPLS)}, got {impl!r}")
    device = torch.device(device)
    if impl == "auto":  # the Triton op is opaque to torch.compile; the lean and fused custom ops trace cleanly
        if (TRITON_IN_AUTO and device.type == "cuda" and not torch.compiler.is_compiling()
                and triton_available()):
            return "triton"
        if device.type != "cpu":
            return "lean"
        if fused_available():
            return "fused"
        if not quiet and not torch.compiler.is_compiling():
            _note_lean_fallback()
        return "lean"
    if impl == "triton" and not triton_available():
        raise InputError("routing_impl='triton' needs the triton package and a CUDA device "
                         "(or TRITON_INTERPRET=1 for CPU tensors); use 'auto' or 'lean'")
    if impl == "fused":
        if device.type != "cpu":
            raise InputError(f"routing_impl='fused' is the CPU kernel, not for {device}; use 'auto', 'lean' or 'triton'")
        if not fused_available():
            reason = unavailable_reason()
            if reason is not None:  # nothing to build with: one line, not a build's traceback
                raise InputError(f"routing_impl='fused' needs the fused CPU routing kernel, which is not built and "
                                 f"cannot be ({reason}); {how_to_build()}, or use routing_impl 'auto' or 'lean'")
            try:
                build_extension()
            except RuntimeError as err:  # a compiler is there and the build failed: not the user's input; keep its log
                raise ValueError(f"routing_impl='fused' is unusable here: {err}") from err
    return impl


_noted = {"lean_fallback": False}


def _note_lean_fallback() -> None:
    """Say once per process that "auto" routes with the lean ops on CPU because the kernel is not built."""
    if _noted["lean_fallback"]:
        return
    _noted["lean_fallback"] = True
    reason = unavailable_reason()
    warnings.warn(f"attnres: the fused CPU routing kernel is not built{f' ({reason})' if reason else ''}, so "
                  f"routing_impl 'auto' routes with the lean PyTorch ops on CPU (the same routing, slower). To build "
                  f"it, {how_to_build()}. routing_impl='lean' asks for the lean ops without this note.",
                  stacklevel=3)


def route_fast(queries: Tensor, sources: list[Tensor], inv: list[Tensor] | None, impl: str,
               eps: float | None = None, each: bool = False) -> tuple[Tensor | tuple[Tensor, ...], Tensor, Tensor]:
    """S routers over n shared sources with a fast implementation ("lean", "triton" or "fused").

    queries (S, D) effective queries; sources n x (B, T, D); inv n x (B, T) from `inv_rms`, or None
    with `eps`: then computed here, by "fused" inside its kernel (in the pass that reads the sources
    anyway, its gradient folded into d sources). Returns mixed (S, B, T, D) (with `each`, S tensors
    (B, T, D): "fused" then gives each router a tensor of its own in eager training), lse (S, B, T),
    weights (S, B, T, n).
    """
    if impl == "fused":
        return route_sources_fused(queries, list(sources), None if inv is None else list(inv), eps=eps, each=each)
    if inv is None:
        if eps is None:
            raise ValueError("route_fast needs inv, or eps to compute it")
        inv = [inv_rms(v, eps) for v in sources]
    route = route_sources_triton if impl == "triton" else route_sources
    mixed, lse, weights = route(queries, list(sources), list(inv))
    return (mixed.unbind() if each else mixed), lse, weights


__all__ = ["IMPLS", "resolve_impl", "route_fast"]
