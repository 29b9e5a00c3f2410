"""Load balancing without an auxiliary loss: DeepSeek-V3's update of the routers' score-correction bias
(`ExpertRouter.take_loads` and `update_bias`, called by `MixtureOfExperts.after_step`).

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

from torch import nn

from attnres.model.moe import ExpertRouter


def expert_routers(model: nn.Module) -> list[ExpertRouter]:
    """The routers of `model`'s mixture-of-experts layers, in depth order."""
    return [m for m in model.modules() if isinstance(m, ExpertRouter)]


__all__ = ["expert_routers"]
