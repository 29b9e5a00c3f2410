"""FLOPs of every variant, computed (not measured) by attnres.model.flops for the ablation's model, so the
ratios sit beside the measured step costs they explain."""

from __future__ import annotations

from attnres.model.model_config import ModelConfig
from attnres.model.flops import flops_per_token
from tools.pages.seeds import table

ABLATION = "ablation/results.json"


def flops_ratios(ctx) -> str:
    """Training FLOPs per token of each variant of the ablation (its cost measurement's models) over
    standard's, and the share of them spent mixing depth."""
    results = ctx.results.json(ABLATION)
    models = {name: ModelConfig.from_dict(entry["model"]) for name, entry in results["cost"]["variants"].items()}
    seq_len = results["settings"]["train"]["seq_len"]
    flops = {name: flops_per_token(config, seq_len) for name, config in models.items()}
    base = flops["standard"].training
    rows = [[name, f"{f.training / base:.3f}x", f"{f.mixing / f.forward:.1%}"] for name, f in flops.items()]
    shape = models["standard"]
    return "\n\n".join([table(["variant", "training FLOPs x standard", "share spent mixing depth"], rows),
                        f"*Computed by `attnres.model.flops.flops_per_token` for the models of "
                        f"{ctx.source(ABLATION)} ({shape.num_layers} layers x {shape.hidden_size}, vocabulary "
                        f"{shape.vocab_size}, sequences of {seq_len} tokens); training counts forward and backward.*"])

