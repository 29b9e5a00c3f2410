"""The `attnres analyze` report: figures/*.png, summary.md, index.html and analysis.json.

Rendered with the block renderer of `attnres.report.document`, as the comparison report is, so
Markdown and HTML carry the same content; every number they show is in analysis.json.
"""

from __future__ import annotations

from pathlib import Path

from attnres.report.document import fmt, jsonable, write_document
from attnres.report.names import slug, unique_name

SUMMARY_HEADER = ["checkpoint", "variant", "step", "val loss", "perplexity", "max weight (all)",
                  "max weight (deepest third)", "mean entropy (nats)", "entropy / ln n", "effective sources",
                  "mean grad RMS"]
FILES_HEADER = ["checkpoint", "path", "layers x width", "parameters", "batches", "tokens"]
CAUSAL_HEADER = ["checkpoint", "ablation", "routers with rho", "mean rho", "positive rho", "largest effect (nats)",
                 "at router / source"]
ROUTER_KINDS = {"attn": "attention", "mlp": "MLP"}  # how a router's name spells its row label's kind


def cosine_routers(source_names: list[list[str]]) -> list[int]:
    """The routers whose source cosines are drawn: the middle sub-layer's, the deepest attention and
    MLP routers, and the final router where there is one; those with two or more sources only."""
    count = len(source_names)
    sublayers = count - count % 2  # an odd count ends with the final router
    if not sublayers:
        return []
    chosen = [sublayers // 2, sublayers - 2, sublayers - 1] + ([count - 1] if count % 2 else [])
    return sorted({r for r in chosen if 0 <= r < count and len(source_names[r]) >= 2})


def _depth_figures(entries: list[dict], routed: list[dict], fig_dir: Path) -> list[tuple]:
    """The figures with one line per checkpoint: [(rel path, alt, caption)]."""
    from attnres.report import depth_analysis_plots, plots  # matplotlib is slow to import: only when a report is written
    from attnres.report.style import series_styles

    styles = series_styles({e["label"]: e for e in entries})  # each variant's look, as in every report

    def per_router(key: str) -> dict[str, list]:  # None at single-source routers
        return {e["label"]: [None if len(names) < 2 else v
                             for v, names in zip(e["depth_stats"][key], e["depth_stats"]["source_names"])]
                for e in routed}

    plots.plot_max_weight_by_depth({e["label"]: e["depth_stats"]["max_weight"] for e in routed},
                                   fig_dir / "max_weight_by_depth.png", "Routing sharpness by depth", styles)
    depth_analysis_plots.plot_entropy_by_depth(per_router("entropy"), per_router("effective_sources"),
                                               fig_dir / "entropy_by_depth.png",
                                               "Routing entropy and effective sources by depth", styles)
    plots.plot_hidden_rms_by_depth({e["label"]: e["depth_stats"]["hidden_rms"] for e in entries},
                                   fig_dir / "hidden_rms_by_depth.png", "Hidden-state RMS by depth", styles)
    depth_analysis_plots.plot_grad_norms_by_depth({e["label"]: e["grad_norms"] for e in entries},
                                                  fig_dir / "grad_norm_by_depth.png", "Gradient scale by depth",
                                                  styles)
    return [("figures/max_weight_by_depth.png", "max routing weight by depth",
             "Token-mean of each router's largest weight, one line per checkpoint: 1/n means uniform over n "
             "sources, 1 means one source takes everything. Single-source routers (such as router 0, which "
             "sees only the embedding) have no point; the last tick of a replacement variant is its final "
             "router."),
            ("figures/entropy_by_depth.png", "routing entropy and effective number of sources by depth",
             "Top: token-mean entropy of each router's weights in nats (0 = one source, ln n = uniform). "
             "Bottom: token-mean effective number of sources exp(H) (1 .. n). Single-source routers have "
             "no point."),
            ("figures/hidden_rms_by_depth.png", "hidden-state RMS by depth",
             "RMS of each sub-layer's input h_s and of the final hidden state, one line per checkpoint; a "
             "steady rise with depth is the growth that dilutes deep layers' contributions."),
            ("figures/grad_norm_by_depth.png", "gradient RMS by depth",
             "RMS of the gradient of the summed next-token loss with respect to each sub-layer's output "
             "(one token's loss terms; even: attention, odd: MLP), one line per checkpoint.")]


def _checkpoint_figures(e: dict, name: str, out_dir: Path, notes: list[str]) -> dict:
    """One routed checkpoint's figures {"routing": (rel, alt, caption), "cosines": ..., "causal": ...};
    records the routers its cosine panels show in e["cosine_routers"] and appends to `notes` what it skips."""
    from attnres.report import depth_analysis_plots, plots

    names = e["depth_stats"]["source_names"]
    rel = f"figures/routing_{name}.png"
    mixers = plots.mixer_layout(e["depth_stats"])
    averages = mixers[1] != plots.ROUTER_AXIS  # DenseFormer's averages after layers, not sub-layers' routers

    def router_name(r: int) -> str:  # "router 3 (MLP)", "router 8 (final)" or "average 1 (after layer 2)"
        label = mixers[0][r]
        if averages:
            return f"average {r} ({label.replace('after', 'after layer')})"
        return f"router {r} ({ROUTER_KINDS.get(label.split()[-1], label)})"

    depth_analysis_plots.plot_routing_heatmap_split(names, e["depth_stats"]["mean_weights"], out_dir / rel,
                                                    f"Routing weights: {e['label']}", mixers)
    columns = plots.heatmap_matrix(names, e["depth_stats"]["mean_weights"])[0]
    layout = ("averages after layers (rows), their plain scalar weights, any sign, on the [0, 1] colour scale "
              "(the cells print the values)" if averages else
              "attention routers (even sub-layers) on top, MLP routers (odd sub-layers) below with the final "
              "router, where the variant has one, as the last row")
    figures = {"routing": (rel, f"routing weights of {e['label']}",
                           f"{e['label']}: mean weight each router (row) gives each source (column), "
                           f"{layout}. Blank cells are sources the router cannot see. Sources: "
                           f"{plots.source_key(columns)}.")}
    chosen = cosine_routers(names)
    e["cosine_routers"] = chosen
    if chosen:
        rel = f"figures/cosines_{name}.png"
        depth_analysis_plots.plot_cosine_matrices(
            {router_name(r): (names[r], e["source_cosines"][r]) for r in chosen},
            out_dir / rel, f"Source cosine similarity: {e['label']}")
        figures["cosines"] = (rel, f"source cosine similarity of {e['label']}",
                              f"{e['label']}: token-mean cosine similarity between the sources of "
                              f"{', '.join(router_name(r) for r in chosen)}, one panel each "
                              "(red: the same direction, blue: opposite). Near 1: the router chooses between "
                              "nearly identical directions. Sources: "
                              f"{plots.source_key([n for r in chosen for n in names[r]])}. "
                              "All routers' matrices are in analysis.json.")
    else:
        notes.append(f"{e['label']}: no router with two or more sources, so no cosine matrices.")
    if e.get("causal"):
        rel = f"figures/causal_{name}.png"
        depth_analysis_plots.plot_causal_routing(e["causal"]["routers"], out_dir / rel,
                                                 f"Routing mass against causal effect: {e['label']}")
        figures["causal"] = (rel, f"routing mass against causal effect of {e['label']}",
                             f"{e['label']}: each point is one source of one router; x is the router's mean "
                             "weight on it, y the change of the held-out loss when that router alone sees it "
                             "replaced (by zero, then by its mean over the batch's tokens). If routing mass "
                             "tracked importance, points would rise to the right; the bottom panel gives each "
                             "router's Spearman rho (routers with three or more sources and varying mass).")
    return figures


def summary_row(entry: dict) -> list[str]:
    """One row of the summary table, as summary.md and index.html print it."""
    s = entry["summary"]
    return [entry["label"], entry["variant"], str(entry["step"]), fmt(entry["val_loss"], ".4f"),
            fmt(entry["val_ppl"], ".2f"), fmt(s["max_weight"], ".3f"), fmt(s["max_weight_deep"], ".3f"),
            fmt(s["mean_entropy"], ".3f"), fmt(s["mean_normalized_entropy"], ".3f"),
            fmt(s["mean_effective_sources"], ".2f"), fmt(s["mean_grad_norm"], ".3g")]


def causal_rows(entry: dict) -> list[list[str]]:
    """Rows of the causal-check table for one checkpoint: per ablation kind, the routers with a rank
    correlation, their mean, how many are positive, and the largest loss change with where it is."""
    causal = entry.get("causal")
    if not causal:
        return []
    rows = []
    for kind, summary in causal["summary"].items():
        effects = [(effect, r["router"], r["source_names"][i]) for r in causal["routers"]
                   for i, effect in enumerate(r["effect"][kind])]
        effect, router, source = max(effects) if effects else (None, "-", "-")
        rows.append([entry["label"], kind, str(summary["routers"]), fmt(summary["mean_rank_correlation"], ".3f"),
                     f"{summary['positive']} of {summary['routers']}", fmt(effect, ".4f"), f"{router} / {source}"])
    return rows


def _document(analysis: dict, shared: list[tuple], per_label: dict[str, dict], notes: list[str]) -> list[tuple]:
    entries = analysis["checkpoints"]
    settings = analysis["settings"]
    blocks = [("h1", "attnres analysis: " + ", ".join(e["label"] for e in entries)),
              ("p", f"Created {analysis.get('created', '-')}; {len(entries)} checkpoint(s), each measured on the "
                    f"first {settings['max_batches']} batch(es) of its run's held-out validation split "
                    f"(device {settings['device']}).")]
    if analysis.get("command"):
        blocks.append(("code", analysis["command"]))
    blocks += [("h2", "Summary"),
               ("table", SUMMARY_HEADER, [summary_row(e) for e in entries], True),
               ("p", "Validation loss in nats/token on the analysed batches (the run's precision, as `attnres eval`); "
                     "perplexity = exp(loss). Max weight: token-mean of each router's largest routing weight, "
                     "averaged over all multi-source routers and over the deepest third of them. Entropy and "
                     "effective sources exp(H) are token means averaged over multi-source routers; entropy / ln n "
                     "is 1 for uniform routing. Grad RMS: mean over sub-layers of the RMS of dLoss/d(sub-layer "
                     "output). '-' where a checkpoint has no routers."),
               ("table", FILES_HEADER,
                [[e["label"], e["checkpoint"], f"{e['num_layers']} x {e['hidden_size']}", f"{e['num_parameters']:,}",
                  str(e["num_batches"]), f"{e['num_tokens']:,}"] for e in entries], False),
               ("h2", "Depth profiles")]
    blocks += [("figure", *figure) for figure in shared]
    for kind, heading in (("routing", "Routing heatmaps"), ("cosines", "Source cosine similarity")):
        drawn = [figures[kind] for figures in per_label.values() if kind in figures]
        if drawn:
            blocks += [("h2", heading)] + [("figure", *figure) for figure in drawn]
    causal = [e for e in entries if e.get("causal")]
    if causal:
        blocks += [("h2", "Causal check of routing"),
                   ("p", "Each source of each router replaced, at that router alone, by zero or by its mean over "
                         "the batch's tokens; the effect is the held-out loss change (ablated minus clean, "
                         "nats/token, the same batches, reference routing). Rho: Spearman's rank correlation "
                         "between a router's mean weights and its sources' effects; positive where routing mass "
                         "follows importance. Per-router values are in analysis.json."),
                   ("table", CAUSAL_HEADER, [row for e in causal for row in causal_rows(e)], True)]
        blocks += [("figure", *figures["causal"]) for figures in per_label.values() if "causal" in figures]
    if notes:
        blocks += [("h2", "Notes")] + [("p", note) for note in notes]
    return blocks


def write_analysis_report(analysis: dict, out_dir: Path) -> dict:
    """Write figures/*.png, summary.md, index.html and analysis.json into out_dir; returns analysis.json's content.

    analysis: {"command", "created", "settings": {"max_batches", "device"}, "checkpoints": [
    `CheckpointAnalysis.to_dict()`, ...]} with distinct labels. analysis.json is the input plus, per
    checkpoint, "cosine_routers" (drawn routers) and "figures" (relative paths), and top-level
    "figures" (every figure, in report order) and "notes" (what was skipped and why).
    """
    entries = analysis["checkpoints"]
    labels = [e["label"] for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"checkpoint labels must be distinct, got {labels}")
    out_dir = Path(out_dir)
    routed = [e for e in entries if e["depth_stats"]["source_names"]]
    notes = [f"{e['label']} ({e['residual']}) has no routers: it appears in the hidden-RMS and gradient "
             "figures only; routing heatmaps, cosine matrices, max weight and entropy skip it."
             for e in entries if not e["depth_stats"]["source_names"]]
    shared = _depth_figures(entries, routed, out_dir / "figures")
    per_label: dict[str, dict] = {}  # label -> {"routing": (rel path, alt, caption), "cosines", "causal"}
    used: set[str] = set()
    for e in routed:
        name = unique_name(slug(e["label"], fallback="checkpoint"), used)
        per_label[e["label"]] = _checkpoint_figures(e, name, out_dir, notes)
    for e in entries:
        e.setdefault("cosine_routers", [])
        e["figures"] = {kind: figure[0] for kind, figure in per_label.get(e["label"], {}).items()}
    every = [f[0] for f in shared] + [figures[kind][0] for kind in ("routing", "cosines", "causal")
                                      for figures in per_label.values() if kind in figures]
    full = jsonable({**analysis, "figures": every, "notes": notes})
    blocks = _document(analysis, shared, per_label, notes)
    write_document(out_dir, full, blocks, json_name="analysis.json", markdown_name="summary.md")
    return full
