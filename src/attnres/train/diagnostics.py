"""Routing diagnostics logged during training: the statistics of `attnres.analysis` at an interval."""

from __future__ import annotations

import torch

from attnres.analysis import (collect_depth_stats, collect_expert_loads, collect_grad_norms, load_imbalance,
                              summarize_max_weights)
from attnres.model import AttnResLM


def routing_diagnostics(model: AttnResLM, batches: list[torch.Tensor]) -> dict:
    """Depth statistics of `model` on held-out `batches` (B, T), as one metrics record (no "step").

    Per-depth lists (JSONL; TensorBoard gets one scalar per depth): `diag/max_weight`,
    `diag/entropy`, `diag/effective_sources` per router; `diag/hidden_rms` per sub-layer input and
    the final hidden state; `diag/grad_rms` per sub-layer output. Scalars: `diag/max_weight_deep`
    (mean over the deepest third of routers) and `diag/entropy_mean`. A mixture-of-experts model
    also gets `diag/expert_load` (per MoE layer, each expert's share of the assignments; JSONL only),
    `diag/expert_imbalance` per MoE layer (largest expert load over the mean,
    `attnres.analysis.expert_load`) and its largest, `diag/expert_imbalance_max`. The model is left
    as found.
    """
    stats = collect_depth_stats(model, batches)
    record = {"diag/hidden_rms": stats.hidden_rms, "diag/grad_rms": collect_grad_norms(model, batches)}
    if stats.max_weight and any(v is not None for v in stats.max_weight):  # a routed variant
        record.update({"diag/max_weight": stats.max_weight, "diag/entropy": stats.entropy,
                       "diag/effective_sources": stats.effective_sources,
                       "diag/max_weight_deep": summarize_max_weights(stats.max_weight)["max_weight_deep"],
                       "diag/entropy_mean": sum(stats.entropy) / len(stats.entropy)})
    loads = collect_expert_loads(model, batches)
    if loads:
        imbalance = [load_imbalance(layer) for layer in loads]
        record.update({"diag/expert_load": loads, "diag/expert_imbalance": imbalance,
                       "diag/expert_imbalance_max": max(imbalance)})
    return record
