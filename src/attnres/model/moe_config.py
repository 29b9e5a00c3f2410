"""MoEConfig: the mixture-of-experts feed-forward's options (attnres.model.moe), validated at construction.

Kept apart from the module so that ModelConfig can hold one without importing the sub-layers."""

from __future__ import annotations

from dataclasses import dataclass

from attnres.common.checks import (check_bool, check_choice, check_int, check_positive_number, dataclass_from_dict,
                                   divisors_hint)
from attnres.common.errors import InputError

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
        # A group is scored by its two best experts, so beyond one group each needs at least two: the
        # allowed values are the divisors of num_experts that leave two or more per group.
        if self.num_experts % self.num_groups or (self.num_groups > 1 and self.num_experts // self.num_groups < 2):
            allowed = divisors_hint(self.num_experts, up_to=max(1, self.num_experts // 2))
            raise InputError(f"MoEConfig.num_groups must divide num_experts={self.num_experts} and leave at least 2 "
                             f"experts per group (a group is scored by its two best); allowed values: {allowed}, "
                             f"got {self.num_groups}")
        per_group = self.num_experts // self.num_groups
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
        return dataclass_from_dict(cls, values, "moe")
