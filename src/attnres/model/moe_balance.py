"""Load balancing without an auxiliary loss: DeepSeek-V3's update of the routers' score-correction bias.

After each optimizer step, every expert's bias moves by a fixed `rate` towards balance:

    b_e <- b_e + rate * sign(mean load - load_e)

where load_e is how many (token, expert) assignments expert e received during the step (all its
micro-batches, all data-parallel ranks). An overloaded expert becomes less likely to be picked,
an idle one more. The bias only decides which experts a token goes to, never their weights
(attnres.model.moe), and nothing is added to the loss, so the loss a comparison reports is the
language-modelling loss alone. Only routers built with `MoEConfig.score_bias` are balanced; every
router counts its loads in training, so the step's imbalance is logged for any mixture of experts.

Why this and not an auxiliary loss: a balance loss adds a term whose weight trades balance against
perplexity and would differ between the residual variants being compared; the bias update leaves
the gradient untouched (Wang et al. 2024, DeepSeek-V3 §2.1.2).
"""

from __future__ import annotations

import torch
from torch import nn

from attnres.model.moe import ExpertRouter


def expert_routers(model: nn.Module) -> list[ExpertRouter]:
    """The routers of `model`'s mixture-of-experts layers, in depth order."""
    return [m for m in model.modules() if isinstance(m, ExpertRouter)]


def take_step_loads(routers: list[ExpertRouter]) -> torch.Tensor:
    """The assignments each router counted since the last call, (R, E) float64 on the routers' device
    (a router that did not run on this rank, e.g. in another pipeline stage, gives zeros); the counts
    start again from zero."""
    if not routers:
        return torch.zeros(0, 0, dtype=torch.float64)
    device = routers[0].weight.device
    rows = []
    for router in routers:
        loads = router.step_loads
        rows.append(torch.zeros(router.weight.shape[0], dtype=torch.float64, device=device)
                    if loads is None else loads.to(device))
        router.step_loads = None
    return torch.stack(rows)


@torch.no_grad()
def update_score_bias(routers: list[ExpertRouter], loads: torch.Tensor, rate: float) -> None:
    """b += rate * sign(mean(load) - load) for each router with a bias and assignments (module doc);
    loads (R, E) as from `take_step_loads`, summed over ranks. rate 0 changes nothing."""
    for router, load in zip(routers, loads, strict=True):
        if rate and router.score_bias is not None and load.sum() > 0:
            step = rate * torch.sign(load.mean() - load)
            router.score_bias.add_(step.to(router.score_bias.dtype))


__all__ = ["expert_routers", "take_step_loads", "update_score_bias"]
