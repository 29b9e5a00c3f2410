"""Every generated block by name: the function that writes it from the result files (attnres.pages.render)."""

from __future__ import annotations

from attnres.pages import (ablation, compare, conversion, costs, decoding, flops, kimi_linear, machinery, options,
                           published, recommendation, scaling, study)
from attnres.pages.cli_help import help_block, subparsers

BLOCKS = {
    "recommendation": recommendation.recommendation_table,
    "recommendation-text": recommendation.recommendation_text,
    "recommendation-sources": recommendation.recommendation_sources,
    "bench-costs": costs.bench_costs,
    "routing-impls": costs.routing_impls,
    "depth-sweep": costs.depth_sweep,
    "ablation-table": ablation.ablation_table,
    "ablation-vs-full": ablation.ablation_vs_full,
    "ablation-causal": ablation.ablation_causal,
    "ablation-probe": ablation.ablation_probe,
    "stability-table": ablation.stability_table,
    "kimi-linear-stability": kimi_linear.kimi_linear_stability,
    "kimi-linear-ablation": kimi_linear.kimi_linear_ablation,
    "ablation-side-by-side": kimi_linear.ablation_side_by_side,
    "moe-dispatch": kimi_linear.moe_dispatch,
    "kimi-linear-costs": kimi_linear.kimi_linear_costs,
    "study-variants": study.study_variants,
    "study-blocks": study.study_blocks,
    "study-query-init": study.study_query_init,
    "scaling-advantage": scaling.scaling_advantage,
    "scaling-probe": scaling.scaling_probe,
    "compare-default": compare.compare_default,
    "finetune": compare.finetune_table,
    "conversion": conversion.conversion_table,
    "conversion-step0": conversion.step0_table,
    "published": published.published_table,
    "flops-ratios": flops.flops_ratios,
    "pipeline-bytes": machinery.pipeline_bytes,
    "fit-coverage": machinery.fit_coverage,
    "variant-options": options.variant_options,
    "decode-speed": decoding.decode_speed,
    "first-answer": decoding.first_answer,
    **{f"cli-{name}": help_block(name) for name in subparsers()},
}
