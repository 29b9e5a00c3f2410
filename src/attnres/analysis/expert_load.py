"""How evenly a mixture-of-experts model spreads its tokens over its experts (attnres.model.moe).

An expert's load is the share of a layer's (token, expert) assignments it receives; a perfectly
balanced layer gives every expert 1 / E. The imbalance of a layer is its largest load over the
mean (1.0: balanced; E: every token on one expert), the quantity DeepSeek-V3's bias update drives down.
"""

from __future__ import annotations

import torch

from attnres.model import AttnResLM, MixtureOfExperts


@torch.no_grad()
def collect_expert_loads(model: AttnResLM, batches: list[torch.Tensor]) -> list[list[float]]:
    """Per mixture-of-experts layer, in depth order, the share of assignments each expert received
    over `batches` (each (B, T) token ids); [] for a model without experts. The model is left as found."""
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    if not layers:
        return []
    counts = [torch.zeros(layer.config.num_experts, dtype=torch.long) for layer in layers]

    def recorder(index: int):
        def record(module, inputs, output) -> None:
            counts[index] += torch.bincount(output[1].flatten().cpu(), minlength=len(counts[index]))
        return record

    handles = [layer.gate.register_forward_hook(recorder(i)) for i, layer in enumerate(layers)]
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            model(batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [(c.double() / max(int(c.sum()), 1)).tolist() for c in counts]


def load_imbalance(loads: list[float]) -> float:
    """A layer's largest expert load over the mean load (1.0 when balanced)."""
    return max(loads) * len(loads) / sum(loads) if sum(loads) else float("nan")


__all__ = ["collect_expert_loads", "load_imbalance"]
