"""A causal check of routing: does a router's weight on a source track how much the loss needs it?

For a router r and one of its sources i, the source is ablated at that router alone (its other
readers still see it): replaced by zero, or by its mean over the batch's tokens (a per-feature
(D,) vector, which keeps the source's average direction and removes what varies by token). The
causal effect is the change of the held-out loss, ablated minus clean, in nats per token. Routing
mass is the router's mean weight on the source over the same tokens. Per router the report gives
Spearman's rank correlation between mass and effect (a probing study, arXiv 2606.13168, reports
that the two need not agree in trained AttnRes models).

Ablation works through a forward pre-hook on the router, so the model routes with the reference
code while it is measured (the fast paths compute a block's or chunk's first phase before its
routers are called); that is the same function, so clean losses equal the model's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from attnres.common.errors import InputError
from attnres.analysis.depth_stats import collect_depth_stats
from attnres.analysis.evaluating import evaluating
from attnres.model.decoder import AttnResLM

ABLATIONS = ("zero", "mean")


@dataclass(frozen=True)
class RouterCausality:
    """One router's routing mass and causal effects over its sources (in `source_names` order).

    mass: mean routing weight per source; effect[kind]: held-out loss with the source ablated at
    this router minus the clean loss (nats/token), kind in ABLATIONS; rank_correlation[kind]:
    Spearman's rho between mass and effect, None with fewer than 3 sources or when either is constant.
    """

    router: int
    source_names: list[str]
    mass: list[float]
    effect: dict[str, list[float]]
    rank_correlation: dict[str, float | None]

    def to_dict(self) -> dict:
        """Every field as plain lists, dicts and numbers."""
        return asdict(self)


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho of paired values (ties get average ranks); None for fewer than 3 pairs or when
    either side is constant (rho is then undefined)."""
    if len(x) != len(y):
        raise ValueError(f"rank_correlation needs paired values, got {len(x)} and {len(y)}")
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(spearmanr(x, y).statistic)


@contextlib.contextmanager
def ablated_source(model: AttnResLM, router: int, source: int, kind: str) -> Iterator[None]:
    """While active, router `router` of `model` sees its source `source` replaced by zero (kind
    "zero") or by its mean over the batch's tokens ("mean"); every other reader sees it unchanged."""
    if kind not in ABLATIONS:
        raise InputError(f"ablation kind must be one of {list(ABLATIONS)}, got {kind!r}")
    scheme = model.residual

    def replace(module, args, kwargs):
        sources = scheme.split_sources(args[0])  # a stream mixer's sources are its n streams
        v = sources[source]
        sources[source] = (torch.zeros_like(v) if kind == "zero"
                           else v.mean(dim=(0, 1), keepdim=True).expand_as(v))
        return (scheme.join_sources(sources), *args[1:]), kwargs

    handle = model.routers[router].register_forward_pre_hook(replace, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _reference_routing(model: AttnResLM) -> Iterator[None]:
    scheme = model.residual
    saved, scheme.impl = scheme.impl, "reference"
    try:
        yield
    finally:
        scheme.impl = saved


def _mean_loss(model: AttnResLM, batches: Sequence[torch.Tensor]) -> float:
    """Token-mean next-token loss over all batches (each (B, T) token ids), float64 sums."""
    total, count = 0.0, 0
    for batch in batches:
        logits = model(batch).logits[:, :-1].float()
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                                       reduction="sum").double())
        count += batch[:, 1:].numel()
    return total / count


def collect_causal_routing(model: AttnResLM, batches: Iterable[torch.Tensor], routers: Sequence[int] | None = None,
                           kinds: Sequence[str] = ABLATIONS) -> tuple[float, list[RouterCausality]]:
    """(clean loss, one `RouterCausality` per router in `routers`, default all) on (B, T) batches.

    Costs one forward pass per batch for every (router, source, kind): for R routers of n sources
    about R n |kinds| passes; choose `routers` for a large model. Eval mode, no grad, reference
    routing; the model's training flag and routing implementation are restored afterwards.
    """
    batches = list(batches)
    names = model.residual.source_names()
    chosen = list(range(len(names))) if routers is None else list(routers)
    for r in chosen:
        if not 0 <= r < len(names):
            raise InputError(f"router index {r} out of range: the model has {len(names)} routers")
    for kind in kinds:
        if kind not in ABLATIONS:
            raise InputError(f"ablation kind must be one of {list(ABLATIONS)}, got {kind!r}")
    with evaluating(model), _reference_routing(model):
        clean = _mean_loss(model, batches)
        mass = collect_depth_stats(model, batches).mean_weights
        results = []
        for r in chosen:
            effect = {kind: [] for kind in kinds}
            for i in range(len(names[r])):
                for kind in kinds:
                    with ablated_source(model, r, i, kind):
                        effect[kind].append(_mean_loss(model, batches) - clean)
            results.append(RouterCausality(r, list(names[r]), mass[r], effect,
                                           {kind: rank_correlation(mass[r], effect[kind]) for kind in kinds}))
    return clean, results


def summarize_causal_routing(results: Sequence[RouterCausality]) -> dict:
    """Per ablation kind: the mean rank correlation over the routers that have one, how many have one,
    and how many of those are positive ({"zero": {"mean_rank_correlation", "routers", "positive"}, ...})."""
    kinds = sorted({kind for r in results for kind in r.rank_correlation}, key=ABLATIONS.index)
    out = {}
    for kind in kinds:
        values = [r.rank_correlation[kind] for r in results if r.rank_correlation.get(kind) is not None]
        out[kind] = {"mean_rank_correlation": sum(values) / len(values) if values else None,
                     "routers": len(values), "positive": sum(v > 0 for v in values)}
    return out
