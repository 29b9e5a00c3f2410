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
softmax in fp32, and top-k sorts the kept experts by score. Scores are fp32 either way (float64 in
a float64 model, where the references' casts to fp32 would only add rounding); the two differ in
rounding only (the order in which the kept scores are summed for normalisation), which is what an
exact conversion needs to match.

Dispatch: the (token, expert) pairs are sorted by expert, and each expert that received tokens runs
one matrix product over its rows; results are scaled and added back per token. The row counts are
read to the host once per call (free on a CPU). Expert parallelism would split the experts over
ranks at this point, an all-to-all of the sorted rows around the per-expert products; not built.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnres.model.mlp import MLP
from attnres.model.moe_config import MoEConfig
from attnres.model.sublayer_protocols import FeedForward


class ExpertRouter(nn.Module):
    """Scores and picks experts (module doc): weight (E, D); `score_bias` (E,) buffer where configured."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size))
        self.register_buffer("score_bias", torch.zeros(config.num_experts) if config.score_bias else None)
        # Assignments per expert since the last bias update (attnres.model.moe_balance), counted in
        # training, or while `counting` (attnres.analysis.expert_load). Plain attributes, not buffers:
        # never saved, never on a meta device.
        self.step_loads: torch.Tensor | None = None
        self.counting = False

    def take_loads(self) -> torch.Tensor:
        """The assignments counted since the last call, (E,) float64 on the weight's device (zeros where
        it did not run, e.g. in another pipeline stage); the count starts again from zero."""
        loads, self.step_loads = self.step_loads, None
        if loads is None:
            return torch.zeros(self.weight.shape[0], dtype=torch.float64, device=self.weight.device)
        return loads.to(self.weight.device)

    @torch.no_grad()
    def update_bias(self, loads: torch.Tensor, rate: float) -> None:
        """DeepSeek-V3's update (attnres.model.moe_balance): b += rate * sign(mean(load) - load), for a
        router with a bias whose (E,) `loads`, summed over ranks, hold assignments; rate 0 changes nothing."""
        if rate and self.score_bias is not None and loads.sum() > 0:
            self.score_bias.add_((rate * torch.sign(loads.mean() - loads)).to(self.score_bias.dtype))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, D) -> (weights (N, k) in x's dtype, experts (N, k) long, scores (N, E) fp32 or wider)."""
        c = self.config
        deepseek = c.router_numerics == "deepseek"
        compute = torch.promote_types(x.dtype, torch.float32)  # fp32, or float64 for a float64 model
        if deepseek:  # the product itself in fp32
            logits = F.linear(x.to(compute), self.weight.to(compute))
        else:
            logits = F.linear(x, self.weight).to(compute)
        scores = logits.softmax(dim=-1) if c.scoring == "softmax" else logits.sigmoid()
        choice = scores if self.score_bias is None else scores + self.score_bias
        if c.num_groups > 1:
            grouped = choice.view(choice.shape[0], c.num_groups, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
            kept = group_score.topk(c.groups_per_token, dim=-1).indices
            eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
            choice = grouped.masked_fill(~eligible[..., None], -math.inf).flatten(1)
        experts = choice.topk(c.experts_per_token, dim=-1, sorted=not deepseek).indices
        if self.training or self.counting:
            counts = torch.zeros(c.num_experts, dtype=torch.float64, device=experts.device)
            counts.index_add_(0, experts.flatten(), torch.ones(experts.numel(), dtype=counts.dtype,
                                                                device=experts.device))
            self.step_loads = counts if self.step_loads is None else self.step_loads + counts
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
        # split and unbind, not slices and indexing: their backward joins the pieces once, where a
        # slice's or an index's backward would write a zero tensor of the whole per expert
        routed = x.index_select(0, rows).split(counts)
        gate_up, down = self.gate_up_proj.unbind(0), self.down_proj.unbind(0)
        outputs = []
        for expert, count in enumerate(counts):
            if count:
                gate, up = F.linear(routed[expert], gate_up[expert]).chunk(2, dim=-1)
                outputs.append(F.linear(F.silu(gate) * up, down[expert]))
        scaled = torch.cat(outputs) * weights.flatten().index_select(0, order)[:, None]
        return torch.zeros_like(x).index_add_(0, rows, scaled)


class MixtureOfExperts(FeedForward):
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

    def flops_per_token(self) -> int:
        """Forward FLOPs per token of the router, the k routed experts and the shared ones:
        2 D E + k x 2 x 3 D F + the shared SwiGLU's."""
        experts, hidden, width = self.experts.down_proj.shape  # (E, D, F)
        shared = 0 if self.shared_experts is None else self.shared_experts.flops_per_token()
        return 2 * hidden * experts + self.config.experts_per_token * 2 * 3 * hidden * width + shared

    def count_loads(self, on: bool) -> None:
        """Count the assignments outside training too (on) or in training only."""
        self.gate.counting = on

    def after_step(self, reduce, rate: float) -> torch.Tensor:
        """The step's assignments per expert (E,), summed over ranks by `reduce`, and the score bias
        moved towards balance by them (attnres.model.moe_balance)."""
        loads = reduce(self.gate.take_loads())
        self.gate.update_bias(loads, rate)
        return loads

    def reset_parameters(self, std: float) -> None:
        """Router and routed experts N(0, std), the score bias zero (the shared experts are
        nn.Linear modules, initialised with the others)."""
        for parameter in (self.gate.weight, self.experts.gate_up_proj, self.experts.down_proj):
            nn.init.normal_(parameter, mean=0.0, std=std)
        if self.gate.score_bias is not None:
            nn.init.zeros_(self.gate.score_bias)


__all__ = ["ExpertRouter", "MixtureOfExperts", "MoEConfig", "RoutedExperts"]
