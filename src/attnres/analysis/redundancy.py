"""Source redundancy: how similar the sources each router chooses between are, token by token."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from attnres.common.errors import InputError
from attnres.analysis.evaluating import evaluating
from attnres.model import AttnResLM

CHUNK_ELEMENTS = 1 << 24  # tokens are processed in chunks of at most this many stacked fp32 elements


def _cosine_sums(sources: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Sum over tokens of the per-token cosine matrix (n, n) float64, and the number of tokens."""
    if len(sources) == 0:
        raise ValueError("cosine_matrix needs at least one source, got none")
    shape = sources[0].shape
    if any(v.shape != shape for v in sources):
        raise ValueError(f"sources must share one shape (B, T, D), got {[tuple(v.shape) for v in sources]}")
    width = shape[-1]
    flat = [v.detach().reshape(-1, width) for v in sources]  # (N, D) each
    tokens = flat[0].shape[0]
    n = len(flat)
    total = torch.zeros(n, n, dtype=torch.float64, device=flat[0].device)
    compute = torch.float64 if any(v.dtype == torch.float64 for v in flat) else torch.float32
    tiny = torch.finfo(compute).tiny
    chunk = max(1, CHUNK_ELEMENTS // max(1, n * width))
    for start in range(0, tokens, chunk):
        block = torch.stack([v[start:start + chunk].to(compute) for v in flat], dim=1)  # (c, n, D)
        # A zero vector has norm 0; dividing by `tiny` keeps it zero, so its cosines are 0.
        unit = block / block.norm(dim=-1, keepdim=True).clamp_min(tiny)
        total += torch.einsum("cid,cjd->ij", unit, unit).double()
    return (total + total.T) / 2, tokens  # the fp32 product can differ in the last bit across the diagonal


def cosine_matrix(sources: Sequence[torch.Tensor]) -> torch.Tensor:
    """Token-mean cosine similarity between every pair of sources.

    sources: n tensors (B, T, D) of one shape. Returns C (n, n) float64 on the sources' device with
    C[i, j] = mean over the B * T tokens of cos(V_i[b, t], V_j[b, t]), computed in fp32 (float64 when
    a source is float64). The cosine with a zero vector is defined as 0 (also a zero vector with
    itself), so C[i, i] is the fraction of tokens where V_i is non-zero. C is symmetric, entries lie
    in [-1, 1]; identical or positively scaled sources give 1, opposite ones -1, orthogonal ones 0.
    """
    total, tokens = _cosine_sums(sources)
    if tokens == 0:
        raise ValueError("cosine_matrix needs at least one token, got none")
    return total / tokens


def collect_source_cosines(model: AttnResLM, batches: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """For each router, in the order of `model.routers`, the `cosine_matrix` of the sources it sees.

    Runs `model` (eval mode, no grad) on each (B, T) token-id batch. Matrix r is (n_r, n_r) float64 on
    the CPU, rows and columns in the order of `model.residual.source_names()[r]`, averaged over all
    tokens of all batches (every token counts once, so batches may differ in size). Empty for
    `standard` (no forward is run); a stream mixer's sources are its n streams. Routers are observed
    through forward pre-hooks, which see the list of sources each router is called with: every
    routing path (reference, fast, two-phase block routing) calls each router as a module once per
    forward. The training flag and the hooks are restored afterwards, also when a forward or a hook raises.
    """
    residual = model.residual
    routers = list(model.routers)
    if not routers:
        return []
    names = residual.source_names()
    sums = [torch.zeros(len(n), len(n), dtype=torch.float64) for n in names]
    calls = [0] * len(routers)
    tokens = 0

    def observer(r: int):
        def record(module, args, kwargs):
            sources = residual.split_sources(args[0] if args else kwargs["sources"])  # a stream mixer's: its n streams
            if len(sources) != len(names[r]):
                raise RuntimeError(f"router {r} saw {len(sources)} sources, source_names() lists {len(names[r])}")
            total, _ = _cosine_sums(sources)
            sums[r] += total.cpu()
            calls[r] += 1
        return record

    with evaluating(model) as hooks:
        for r, router in enumerate(routers):
            hooks.append(router.register_forward_pre_hook(observer(r), with_kwargs=True))
        for ids in batches:
            before = list(calls)
            model(ids)
            if any(after != start + 1 for after, start in zip(calls, before)):
                raise RuntimeError("each router must be called exactly once per forward")
            tokens += ids.numel()

    if tokens == 0:
        raise InputError("collect_source_cosines needs at least one non-empty batch")
    return [s / tokens for s in sums]
