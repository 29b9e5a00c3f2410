"""The cost targets the benchmark reports against, and whether a run met them."""

from __future__ import annotations

from dataclasses import dataclass

from attnres.bench.config import BenchConfig


@dataclass(frozen=True)
class Target:
    """`metric` of `variant` (a ratio to standard, or the router's fraction of copy bandwidth) `op` `limit`."""

    variant: str  # a residual variant, or "router"
    metric: str  # a key of a variant's "ratios", or "fraction_of_copy"
    op: str  # "<=" or ">="
    limit: float
    label: str

    def met(self, value: float) -> bool:
        """Whether a measured value satisfies the target."""
        return value <= self.limit if self.op == "<=" else value >= self.limit


TARGETS = (
    Target("block_attnres", "train_step", "<=", 1.05, "Block AttnRes training step / standard"),
    Target("block_attnres", "peak_memory", "<=", 1.10, "Block AttnRes peak memory / standard"),
    Target("delta_block", "train_step", "<=", 1.05, "Delta Block training step / standard"),
    Target("delta_block", "peak_memory", "<=", 1.10, "Delta Block peak memory / standard"),
    Target("full_attnres", "train_step", "<=", 1.25, "Full AttnRes training step / standard"),
    Target("full_attnres", "peak_memory", "<=", 1.50, "Full AttnRes peak memory / standard"),
    Target("delta_attnres", "train_step", "<=", 1.25, "Delta AttnRes training step / standard"),
    Target("delta_attnres", "peak_memory", "<=", 1.50, "Delta AttnRes peak memory / standard"),
    Target("block_attnres", "decode_per_token", "<=", 1.03, "Block AttnRes decode time per token / standard"),
    Target("delta_block", "decode_per_token", "<=", 1.03, "Delta Block decode time per token / standard"),
    Target("router", "fraction_of_copy", ">=", 0.50, "Router forward bytes/s / copy bytes/s"),
)

# The conditions the targets are stated for.
TARGET_CONDITIONS = "CPU, bf16 autocast, hidden 256-512, 24 layers, seq 256"


def condition_mismatches(config: BenchConfig) -> list[str]:
    """How `config` differs from the targets' conditions (empty when it matches them)."""
    out = []
    if config.device != "cpu":
        out.append(f"device {config.device} (targets: cpu)")
    if config.precision != "bf16":
        out.append(f"precision {config.precision} (targets: bf16)")
    if not 256 <= config.hidden_size <= 512:
        out.append(f"hidden {config.hidden_size} (targets: 256-512)")
    if config.num_layers != 24:
        out.append(f"{config.num_layers} layers (targets: 24)")
    if config.seq_len != 256:
        out.append(f"seq {config.seq_len} (targets: 256)")
    return out


def evaluate_targets(models: dict | None, router: dict | None) -> list[dict]:
    """One row per target: {"target", "variant", "metric", "op", "limit", "measured", "status"}.

    models: run_model_bench's result (or None); router: run_router_bench's result (or None).
    status is "met", "missed", or "not measured" (variant not benchmarked, or no value).
    """
    rows = []
    for target in TARGETS:
        if target.variant == "router":
            measured = (router or {}).get("forward", {}).get(target.metric)
        else:
            variant = ((models or {}).get("variants") or {}).get(target.variant)
            measured = variant["ratios"].get(target.metric) if variant else None
        status = "not measured" if measured is None else ("met" if target.met(measured) else "missed")
        rows.append({"target": target.label, "variant": target.variant, "metric": target.metric, "op": target.op,
                     "limit": target.limit, "measured": measured, "status": status})
    return rows
