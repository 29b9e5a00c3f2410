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
    (`ExpertRouter.take_loads`); the counts start again from zero."""
    if not routers:
        return torch.zeros(0, 0, dtype=torch.float64)
    return torch.stack([router.take_loads().to(routers[0].weight.device) for router in routers])


def update_score_bias(routers: list[ExpertRouter], loads: torch.Tensor, rate: float) -> None:
    """`ExpertRouter.update_bias` of each router with its row of `loads` (R, E), summed over ranks."""
    for router, load in zip(routers, loads, strict=True):
        router.update_bias(load, rate)


__all__ = ["expert_routers", "take_step_loads", "update_score_bias"]
