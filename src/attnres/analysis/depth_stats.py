"""Depth statistics of a model on some batches: routing weights per router, hidden-state RMS per depth."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch

from attnres.common.errors import InputError
from attnres.analysis.router_stats import routing_entropy
from attnres.analysis.evaluating import evaluating
from attnres.analysis.sharpness import mean_max_weight
from attnres.model import AttnResLM


@dataclass
class DepthStats:
    """Token-averaged statistics by depth; plain lists, so `to_dict()` is JSON-safe.

    source_names: per router, the names of its sources (`model.residual.source_names()`).
    mean_weights: per router, per source, the token-mean softmax weight (each row sums to 1).
    max_weight:   per router, the token-mean of the largest weight; None for a single-source router.
    hidden_rms:   RMS of each sub-layer's input h_s, s = 0 .. 2L-1, then of the final hidden state
                  fed to the final norm (length 2L + 1).
    num_tokens:   tokens the averages are over.
    entropy:      per router, the token-mean entropy of its weights in nats (`routing_entropy`;
                  0 for a single source, ln n for uniform weights).
    effective_sources: per router, the token-mean of exp(entropy) (`effective_sources`; 1 .. n).
    mixer_labels: per router, its label for figures (`ResidualScheme.mixer_labels`: "0 attn", ...,
                  "final", or "after 3"); mixer_axis: what the labels count (`ResidualScheme.mixer_axis`).
    Routed fields are empty lists for `standard`. `entropy`, `effective_sources` and the labels are
    also empty (the axis None) when loaded from a dict written before they existed.
    """

    source_names: list[list[str]]
    mean_weights: list[list[float]]
    max_weight: list[float | None]
    hidden_rms: list[float]
    num_tokens: int = 0
    entropy: list[float] = field(default_factory=list)
    effective_sources: list[float] = field(default_factory=list)
    mixer_labels: list[str] = field(default_factory=list)
    mixer_axis: str | None = None

    def to_dict(self) -> dict:
        """Plain dict of lists, numbers, strings and None."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DepthStats":
        """Inverse of `to_dict` (extra keys are an error; `num_tokens`, `entropy` and
        `effective_sources` may be absent)."""
        return cls(**data)


def collect_depth_stats(model: AttnResLM, batches: Iterable[torch.Tensor]) -> DepthStats:
    """Run `model` (eval mode, no grad) on each (B, T) token-id batch and average over all tokens.

    Batches may differ in size: every token counts once. The model's training flag is restored and
    the RMS hooks removed afterwards, also when a forward raises.
    """
    names = model.residual.source_names()
    num_sublayers = 2 * len(model.layers)
    sum_sq, count = [0.0] * (num_sublayers + 1), [0] * (num_sublayers + 1)  # per depth, for the RMS
    weight_sums = [torch.zeros(len(n), dtype=torch.float64) for n in names]
    max_sums: list[float | None] = [None if len(n) < 2 else 0.0 for n in names]
    entropy_sums, effective_sums = [0.0] * len(names), [0.0] * len(names)
    tokens = 0

    def rms_hook(slot: int):
        def record(_module, args):
            # float64 sums: many tokens of fp32/bf16 squares would otherwise lose precision.
            sum_sq[slot] += float(args[0].detach().double().pow(2).sum())
            count[slot] += args[0].numel()
        return record

    # h_s is what sub-layer s normalises, so a pre-hook on its norm sees exactly h_s; the final
    # norm's input is the hidden state after the last sub-layer (or the final router).
    with evaluating(model) as hooks:
        for i, layer in enumerate(model.layers):
            hooks.append(layer.input_layernorm.register_forward_pre_hook(rms_hook(2 * i)))
            hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(rms_hook(2 * i + 1)))
        hooks.append(model.norm.register_forward_pre_hook(rms_hook(num_sublayers)))
        for ids in batches:
            routing = model(ids, return_routing=True).routing or []
            if len(routing) != len(names):
                raise RuntimeError(f"model returned {len(routing)} routing tensors for {len(names)} routers")
            n = ids.numel()
            tokens += n
            for r, w in enumerate(routing):
                weight_sums[r] += w.detach().double().sum(dim=(0, 1)).cpu()
                entropy = routing_entropy(w.detach()).double()
                entropy_sums[r] += float(entropy.sum())
                effective_sums[r] += float(entropy.exp().sum())  # = effective_sources(w)
            # Per-batch token means, re-weighted by the batch's token count.
            for r, value in enumerate(mean_max_weight(routing)):
                if value is not None:
                    max_sums[r] += value * n

    if tokens == 0:
        raise InputError("collect_depth_stats needs at least one non-empty batch")
    return DepthStats(
        source_names=[list(n) for n in names],
        mean_weights=[(s / tokens).tolist() for s in weight_sums],
        max_weight=[None if m is None else m / tokens for m in max_sums],
        hidden_rms=[math.sqrt(s / n) if n else math.nan for s, n in zip(sum_sq, count)],
        num_tokens=tokens,
        entropy=[e / tokens for e in entropy_sums],
        effective_sources=[e / tokens for e in effective_sums],
        mixer_labels=model.residual.mixer_labels(), mixer_axis=model.residual.mixer_axis)
