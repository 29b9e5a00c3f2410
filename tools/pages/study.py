"""The 24-layer reproduction study (results/study): losses over seeds, differences paired by seed, the
routing of the deepest routers, the block count and the router-query initialisation."""

from __future__ import annotations

import math

from attnres.analysis.intervals import mean
from tools.pages.seeds import (
    deep_routing, interval, losses_by_seed, paired_difference, signed_interval, table, variants_by_name)
from tools.pages.sources import provenance
from attnres.report.document import fmt

STUDY = "study/results.json"
MAIN = ["standard", "full_attnres", "block_attnres (N=8)", "delta_attnres", "delta_block (N=8)"]
BLOCKS = [f"{r} (N={n})" for r in ("block_attnres", "delta_block") for n in (1, 2, 4, 8)]
INIT = ["block_attnres (N=8)", "block_attnres (N=8) [q~N(0,0.02)]", "delta_block (N=8)",
        "delta_block (N=8) [q~N(0,0.02)]"]
LOSS_HEADER = ["variant", "seeds", "val loss (95 % CI)", "Δ loss vs {reference}, paired (95 % CI)"]
ROUTING_HEADER = ["variant", "max weight, deepest third (95 % CI)", "uniform 1/n there", "effective sources",
                  "weight on the embedding"]


def loss_rows(names: list[str], variants: dict[str, dict], reference: str = "standard") -> list[list[str]]:
    """One row per variant present: seeds, loss interval, and the difference to `reference` paired by seed."""
    rows = []
    for name in (n for n in names if n in variants):
        losses = list(losses_by_seed(variants[name]).values())
        rows.append([name, str(len(losses)), interval(losses), "baseline" if name == reference else
                     signed_interval(paired_difference(variants[name], variants[reference]))])
    return rows


def routing_rows(names: list[str], variants: dict[str, dict]) -> list[list[str]]:
    """One row per routed variant: its deepest routers' max weight, uniform weight, effective sources and
    weight on the embedding, over seeds."""
    rows = []
    for name in (n for n in names if n in variants and n != "standard"):
        per_seed = [d for d in map(deep_routing, variants[name]["runs"]) if d is not None]
        if per_seed:
            rows.append([name, interval([d["max_weight"] for d in per_seed]),
                         fmt(mean([d["uniform"] for d in per_seed]), ".3f"),
                         interval([d["effective_sources"] for d in per_seed if not math.isnan(d["effective_sources"])],
                                  ".2f"),
                         interval([d["embedding_weight"] for d in per_seed])])
    return rows


def _tables(ctx, parts: list[tuple[list[str], list[list[str]]]]) -> str:
    results = ctx.results.json(STUDY)
    return "\n\n".join([table(header, rows) for header, rows in parts]
                       + [provenance(results, ctx.source(STUDY))])


def _loss_header(reference: str = "standard") -> list[str]:
    return [h.format(reference=reference) for h in LOSS_HEADER]


def study_variants(ctx) -> str:
    """The five main variants: losses, paired differences, and the routing of their deepest routers."""
    variants = variants_by_name(ctx.results.json(STUDY))
    return _tables(ctx, [(_loss_header(), loss_rows(MAIN, variants)), (ROUTING_HEADER, routing_rows(MAIN, variants))])


def study_blocks(ctx) -> str:
    """Block AttnRes and Delta Block with 1, 2, 4 and 8 blocks."""
    variants = variants_by_name(ctx.results.json(STUDY))
    return _tables(ctx, [(_loss_header(), loss_rows(["standard"] + BLOCKS, variants)),
                         (ROUTING_HEADER, routing_rows(BLOCKS, variants))])


def study_query_init(ctx) -> str:
    """Zero against N(0, 0.02) router queries, each against the same variant with zero queries."""
    variants = variants_by_name(ctx.results.json(STUDY))
    rows = loss_rows(INIT[:2], variants, reference=INIT[0]) + loss_rows(INIT[2:], variants, reference=INIT[2])
    return _tables(ctx, [(_loss_header("zero queries"), rows)])
