"""Mixture-of-experts feed-forward, as DeepSeek-V3 and Kimi Linear define it, and Qwen3-MoE's form.

A router scores every routed expert for each token and keeps the top k; the token's output is the
weighted sum of those experts' SwiGLU outputs, plus the shared experts' (a SwiGLU every token goes
through):

    scores  = softmax(x W_r^T)  or  sigmoid(x W_r^T)                       (N, E), at least fp32
    choice  = scores + b        (b: DeepSeek-V3's score-correction bias, used to pick, never to weigh)
    groups  = the experts split into G groups; each group scored by the sum of its two best choices;
              only the best `groups_per_token` groups stay eligible
    top     = the k eligible experts with the largest `choice`
    w       = scores[top], divided by their sum when normalize_top_k, times routed_scale
    y       = sum_j w_j SwiGLU_top_j(x) + SwiGLU_shared(x)

The router's last bits (`router_numerics`) follow one of two conventions. "deepseek" (DeepSeek-V3,
Kimi Linear): the input and the router weight are cast to fp32 before the product, and top-k
returns the kept experts unsorted. "qwen3" (Qwen3-MoE): the product runs in the input's dtype, the
softmax in fp32, and top-k sorts the kept experts by score. Scores are fp32 either way; the two
differ in rounding only (the order in which the kept scores are summed for normalisation), which
is what an exact conversion needs to match.

Dispatch: the (token, expert) pairs are sorted by expert, and each expert that received tokens runs
one matrix product over its rows; results are scaled and added back per token. The row counts are
read to the host once per call (free on a CPU). Expert parallelism would split the experts over
ranks at this point, an all-to-all of the sorted rows around the per-expert products; not built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnres.common.checks import check_bool, check_choice, check_int, check_positive_number
from attnres.common.errors import InputError
from attnres.model.layers import MLP

SCORINGS = ("softmax", "sigmoid")
ROUTER_NUMERICS = ("deepseek", "qwen3")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """The mixture-of-experts feed-forward of a decoder (module doc).

    num_experts routed experts of SwiGLU width expert_size, experts_per_token (k) of them per token;
    shared_experts: the shared SwiGLU's width in experts (width shared_experts x expert_size; 0: none).
    scoring: "softmax" (Qwen3-MoE, Mixtral) or "sigmoid" (DeepSeek-V3, Kimi Linear).
    normalize_top_k: divide the k kept scores by their sum. routed_scale: multiply them (Kimi Linear
    2.446). num_groups, groups_per_token: grouped routing (DeepSeek-V3's n_group, topk_group; 1, 1:
    none). score_bias: a score-correction bias per expert that changes which experts are picked and
    not their weights (DeepSeek-V3's e_score_correction_bias; a buffer, zero at the start).
    router_numerics: "deepseek" or "qwen3" (module doc). dense_layers: the first this many layers
    keep the dense MLP (Kimi Linear's first_k_dense_replace).
    """

    num_experts: int
    experts_per_token: int
    expert_size: int
    shared_experts: int = 0
    scoring: str = "softmax"
    normalize_top_k: bool = True
    routed_scale: float = 1.0
    num_groups: int = 1
    groups_per_token: int = 1
    score_bias: bool = False
    router_numerics: str = "deepseek"
    dense_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_size", "num_groups", "groups_per_token"):
            check_int(getattr(self, name), f"MoEConfig.{name}")
        for name in ("shared_experts", "dense_layers"):
            check_int(getattr(self, name), f"MoEConfig.{name}", minimum=0)
        check_choice(self.scoring, "MoEConfig.scoring", SCORINGS)
        check_choice(self.router_numerics, "MoEConfig.router_numerics", ROUTER_NUMERICS)
        for name in ("normalize_top_k", "score_bias"):
            check_bool(getattr(self, name), f"MoEConfig.{name}")
        check_positive_number(self.routed_scale, "MoEConfig.routed_scale")
        if self.num_experts % self.num_groups:
            raise InputError(f"MoEConfig.num_groups must divide num_experts={self.num_experts}; allowed values: "
                             f"{[g for g in range(1, self.num_experts + 1) if self.num_experts % g == 0]}, "
                             f"got {self.num_groups}")
        per_group = self.num_experts // self.num_groups
        if self.num_groups > 1 and per_group < 2:
            raise InputError(f"MoEConfig.num_groups: a group is scored by its two best experts, so it needs at "
                             f"least 2; num_experts={self.num_experts} allows num_groups up to "
                             f"{self.num_experts // 2}, got {self.num_groups}")
        if self.groups_per_token > self.num_groups:
            raise InputError(f"MoEConfig.groups_per_token must be from 1 to num_groups={self.num_groups}, "
                             f"got {self.groups_per_token}")
        eligible = self.groups_per_token * per_group
        if self.experts_per_token > eligible:
            raise InputError(f"MoEConfig.experts_per_token must be from 1 to the experts of the groups a token may "
                             f"use (groups_per_token x num_experts / num_groups = {eligible}), "
                             f"got {self.experts_per_token}")

    @classmethod
    def from_dict(cls, values: "MoEConfig | dict") -> "MoEConfig":
        """A MoEConfig from itself or a dict of its fields; InputError naming unknown fields."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, dict):
            raise InputError(f"moe must be a mapping of MoEConfig fields, got {type(values).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"MoEConfig: unknown field(s) {unknown}; allowed fields: {sorted(known)}")
        return cls(**values)

    def active_parameters_per_token(self, hidden_size: int) -> int:
        """Weights one token's feed-forward multiplies by: k routed experts, the shared ones, the router."""
        swiglu = 3 * hidden_size * self.expert_size
        return (self.experts_per_token + self.shared_experts) * swiglu + self.num_experts * hidden_size


class ExpertRouter(nn.Module):
    """Scores and picks experts (module doc): weight (E, D); `score_bias` (E,) buffer where configured."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size))
        self.register_buffer("score_bias", torch.zeros(config.num_experts) if config.score_bias else None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, D) -> (weights (N, k) in x's dtype, experts (N, k) long, scores (N, E) fp32 or wider)."""
        c = self.config
        deepseek = c.router_numerics == "deepseek"
        if deepseek:  # the product itself in fp32
            logits = F.linear(x.float(), self.weight.float())
        else:
            logits = F.linear(x, self.weight).float()
        scores = logits.softmax(dim=-1) if c.scoring == "softmax" else logits.sigmoid()
        choice = scores if self.score_bias is None else scores + self.score_bias
        if c.num_groups > 1:
            grouped = choice.view(choice.shape[0], c.num_groups, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
            kept = group_score.topk(c.groups_per_token, dim=-1).indices
            eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
            choice = grouped.masked_fill(~eligible[..., None], -math.inf).flatten(1)
        experts = choice.topk(c.experts_per_token, dim=-1, sorted=not deepseek).indices
        weights = scores.gather(1, experts)
        if c.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights * c.routed_scale).to(x.dtype), experts, scores


class RoutedExperts(nn.Module):
    """E SwiGLU experts as stacked weights: gate_up_proj (E, 2F, D) (gate rows first), down_proj (E, D, F)."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * config.expert_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, hidden_size, config.expert_size))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x (N, D), experts and weights (N, k) -> (N, D): sum_j weights[:, j] * expert_{experts[:, j]}(x).

        Sorted dispatch: one matrix product per expert over the rows routed to it, no loop over tokens."""
        k = experts.shape[1]
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        rows = order // k  # the token of each sorted (token, expert) pair
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        routed = x.index_select(0, rows)
        outputs, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                gate, up = F.linear(routed[start:start + count], self.gate_up_proj[expert]).chunk(2, dim=-1)
                outputs.append(F.linear(F.silu(gate) * up, self.down_proj[expert]))
            start += count
        scaled = torch.cat(outputs) * weights.flatten().index_select(0, order)[:, None]
        return torch.zeros_like(x).index_add_(0, rows, scaled)


class MixtureOfExperts(nn.Module):
    """The MoE feed-forward (module doc): (B, T, D) -> (B, T, D). Parameter names as transformers'
    Kimi Linear: gate (the router), experts, shared_experts (a SwiGLU `MLP`, when configured)."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = ExpertRouter(hidden_size, config)
        self.experts = RoutedExperts(hidden_size, config)
        self.shared_experts = (MLP(hidden_size, config.expert_size * config.shared_experts)
                               if config.shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        flat = x.reshape(-1, x.shape[-1])
        weights, experts, _ = self.gate(flat)
        out = self.experts(flat, experts, weights).view_as(x)
        return out if self.shared_experts is None else out + self.shared_experts(x)


__all__ = ["ExpertRouter", "MixtureOfExperts", "MoEConfig", "RoutedExperts"]
