"""The README's answer: one row per variant with its loss difference to standard, compute advantage,
training-step and memory cost, decoding cost and exact conversion; and the recommendation drawn from
them by a stated rule."""

from __future__ import annotations

from attnres.model.config import entry_options
from attnres.pages import ablation, costs, scaling
from attnres.pages.conversion import CONVERSION, exact_conversion
from attnres.pages.seeds import table
from attnres.pages.sources import provenance
from attnres.report.compare_report import signed

CHEAP = 1.2  # "cheap": a training step at most this multiple of standard's, in fp32 and in bf16
NBSP = "\u00a0"  # keeps a figure and its interval on one line when a narrow screen wraps the table
LABELS = {"standard": "standard", "block_attnres": "Block AttnRes", "full_attnres": "Full AttnRes",
          "delta_attnres": "Delta AttnRes", "delta_block": "Delta Block", "denseformer": "DenseFormer",
          "hyper_connections": "hyper-connections", "mhc": "mHC"}


def _by_residual(results: dict, names) -> dict[str, str]:
    """residual -> the name of its run with default router options (the ablated routers carry '[...]')."""
    residual = {v["name"]: v["residual"] for v in results["variants"]}
    return {residual[name]: name for name in names if "[" not in name}


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def variant_rows(ctx) -> list[dict]:
    """Per variant (standard first, then by loss difference): every figure of the table, as numbers."""
    ablation_results = ctx.results.json(ablation.ABLATION)
    paired = ablation.paired_summary(ablation_results)
    in_ablation = _by_residual(ablation_results, ["standard", *paired])
    scaling_results = ctx.results.json(scaling.SCALING)
    in_scaling = _by_residual(scaling_results, [v["name"] for v in scaling_results["variants"]])
    fp32, bf16 = (costs.ratios(ctx.results.json(p)) for p in (costs.FP32, costs.BF16))
    converts = exact_conversion(ctx.results)
    rows = []
    for residual, name in in_ablation.items():
        loss = paired.get(name)
        rows.append({"residual": residual, "name": name, "loss": loss,
                     "advantage": scaling.advantage_at_max(scaling_results, in_scaling[residual])
                     if residual in in_scaling and residual != "standard" else None,
                     "fp32": fp32.get(residual, {}), "bf16": bf16.get(residual, {}),
                     "converts": converts.get(residual, "not measured")})
    return sorted(rows, key=lambda r: (r["residual"] != "standard", r["loss"]["mean"] if r["loss"] else 0))


def _loss_cell(loss: dict | None) -> str:
    if loss is None:
        return "baseline"
    half = "" if loss["half"] is None else f"{NBSP}±{NBSP}{loss['half']:.3f}"
    return f"{signed(loss['mean'])}{half}"


def _advantage_cell(advantage: dict | None, residual: str) -> str:
    if residual == "standard":
        return "1"
    if advantage is None:
        return "not in the sweep"
    value, low, high = (advantage[k] for k in ("value", "low", "high"))
    if value is None:
        return "beyond standard's floor"
    interval = "" if low is None or high is None else f"{NBSP}[{low:.2f},{NBSP}{high:.2f}]"
    return f"{value:.2f}x{interval}" + ("" if advantage["law"] == "saturating" else " (power law)")


def recommendation_table(ctx) -> str:
    """The table at the top of the README."""
    rows = []
    for r in variant_rows(ctx):
        f, b = r["fp32"], r["bf16"]
        rows.append([f"`{r['residual']}`", _loss_cell(r["loss"]), _advantage_cell(r["advantage"], r["residual"]),
                     f"{_times(f.get('train_step'))}{NBSP}/{NBSP}{_times(b.get('train_step'))}",
                     f"{_times(f.get('peak_memory'))}{NBSP}/{NBSP}{_times(b.get('peak_memory'))}",
                     _times(f.get("decode_compiled_per_token")), r["converts"]])
    header = ["residual", "Δ loss, nats (95 % CI)", "compute advantage, FLOPs (95 % CI)", "train step, fp32 / bf16",
              "peak memory, fp32 / bf16", "decode per token", "converts exactly"]
    return table(header, rows)


def _excludes_one(interval: dict | None) -> bool | None:
    """Whether an advantage's interval lies above 1 (None without an interval)."""
    return None if not interval or interval.get("low") is None else interval["low"] > 1


def _option_settings(entry: dict | None) -> list[str]:
    """A result entry's options that differ from their defaults, as YAML settings: ["`num_blocks: 8`"]."""
    options = entry_options(entry) if entry else None
    if options is None:
        return []
    defaults = options.defaults()
    return [f"`{name}: {value}`" for name, value in options.to_dict().items()
            if value is not None and (name not in defaults or value != defaults[name])]


def recommendation_text(ctx) -> str:
    """The recommendation, drawn from the table's figures by the rule it states, and the evidence's scale."""
    rows = variant_rows(ctx)
    better = [r for r in rows if r["loss"] and r["loss"]["excludes_zero"] and r["loss"]["mean"] < 0]
    cheap = [r for r in better if all((r[p].get("train_step") or float("inf")) <= CHEAP for p in ("fp32", "bf16"))]
    ablation_results, scaling_results = ctx.results.json(ablation.ABLATION), ctx.results.json(scaling.SCALING)
    entries = {v["name"]: v for v in ablation_results["variants"]}
    label = lambda r: LABELS.get(r["residual"], r["residual"])  # noqa: E731
    lines = []
    if cheap:
        best, advantage = cheap[0], cheap[0]["advantage"]
        setting = ", ".join([f"`residual: {best['residual']}`", *_option_settings(entries.get(best["name"]))])
        if advantage is None:
            sure = "it was not in the scaling sweep"
        else:
            flops = "excludes" if _excludes_one(advantage) else "holds"
            time = _excludes_one(advantage.get("time"))
            sure = (f"its compute advantage's interval {flops} 1 in training FLOPs"
                    + ("" if time is None else f" and {'excludes' if time else 'holds'} 1 in wall-clock time on "
                       "the sweep's CPU"))
        lines.append(f"**Use {label(best)}** ({setting}): of the variants whose loss interval lies below standard's, "
                     f"it gains the most among those whose training step costs at most {CHEAP}x standard's in "
                     f"fp32 and in bf16; {sure}.")
    else:
        lines.append(f"**Keep `standard`**: no variant's loss interval lies below standard's at a training step of "
                     f"at most {CHEAP}x standard's in fp32 and in bf16.")
    top = better[0] if better else None
    if top and (not cheap or top is not cheap[0]):
        lines.append(f"The largest gain at any cost is that of {label(top)}, at "
                     f"{_times(top['fp32'].get('train_step'))} (fp32) and {_times(top['bf16'].get('train_step'))} "
                     f"(bf16) of standard's training step.")
    unresolved = [label(r) for r in rows if r["loss"] and not r["loss"]["excludes_zero"]]
    if unresolved:
        lines.append(f"Not shown to differ from standard: {', '.join(unresolved)}.")
    lines.append(f"Scale of the evidence: the loss column from {ablation.scale_words(ablation_results)}; the compute "
                 f"advantage from {scaling.sweep_words(scaling_results)}; costs at "
                 f"{costs.shape_words(ctx.results.json(costs.FP32))}.")
    return "\n\n".join(lines)


def recommendation_sources(ctx) -> str:
    """Where every column of the table comes from, with each source's command, date and machine."""
    parts = {"Loss": (ablation.ABLATION, None), "Compute advantage": (scaling.SCALING, "cost"),
             "Costs, fp32": (costs.FP32, "bench"), "Costs, bf16": (costs.BF16, "bench")}
    lines = []
    for label, (path, kind) in parts.items():
        result = ctx.results.json(path)
        code = (costs.code_path(result) if kind == "bench" else result["cost"]["settings"] if kind == "cost" else None)
        lines.append(f"- {label}: " + provenance(result, ctx.source(path), code_path=code).strip("*"))
    conversion = ctx.results.json(CONVERSION)
    lines.append("- Exact conversion: " + provenance(conversion, ctx.source(CONVERSION)).strip("*"))
    return "\n".join(lines)
