"""Choosing a routing implementation: the reference, the memory-lean op, or the Triton kernel.

`IMPLS` is the one list of implementation names; configs and options validate against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnres.routing.lean import route_sources
from attnres.routing.triton_route import route_sources_triton, triton_available

# How routers compute (the same function at different speeds): "auto" = Triton on CUDA when available,
# else the memory-lean custom op; "reference" = the plain method §2 code every path is tested against.
IMPLS = ("auto", "reference", "lean", "triton")


def resolve_impl(impl: str, device: torch.device) -> str:
    """The implementation `impl` means on `device`: "auto" -> "triton" on CUDA when Triton is
    installed (outside torch.compile), else "lean". Raises ValueError for an unknown name or an unusable "triton"."""
    if impl not in IMPLS:
        raise ValueError(f"routing_impl must be one of {list(IMPLS)}, got {impl!r}")
    if impl == "auto":  # the Triton op is opaque to torch.compile; the lean custom op traces cleanly
        use_triton = device.type == "cuda" and not torch.compiler.is_compiling() and triton_available()
        return "triton" if use_triton else "lean"
    if impl == "triton" and not triton_available():
        raise ValueError("routing_impl='triton' needs the triton package and a CUDA device "
                         "(or TRITON_INTERPRET=1 for CPU tensors); use 'auto' or 'lean'")
    return impl


def route_fast(queries: Tensor, sources: list[Tensor], inv: list[Tensor], impl: str) -> tuple[Tensor, Tensor, Tensor]:
    """S routers over n shared sources with a fast implementation ("lean" or "triton").

    queries (S, D) effective queries; sources n x (B, T, D); inv n x (B, T) from `inv_rms`.
    Returns mixed (S, B, T, D), lse (S, B, T), weights (S, B, T, n).
    """
    if impl == "triton":
        return route_sources_triton(queries, list(sources), list(inv))
    return route_sources(queries, list(sources), list(inv))


__all__ = ["IMPLS", "resolve_impl", "route_fast"]
