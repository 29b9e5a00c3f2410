"""Published results at scale (results/published/published.json: each source's figures and where they
were read), and the Kimi ablation's losses that the ablation table sets beside ours."""

from __future__ import annotations

from attnres.common.errors import InputError
from tools.pages.seeds import table

PUBLISHED = "published/published.json"
# Kimi's router ablations, by the names our ablation preset gives the same variants.
KIMI_ABLATION_NAMES = {"standard": "standard", "denseformer": "denseformer", "mhc": "mhc",
                       "full_attnres": "full_attnres", "full_attnres_input_query": "full_attnres [input query]",
                       "full_attnres_sigmoid": "full_attnres [sigmoid]",
                       "full_attnres_no_key_norm": "full_attnres [no key norm]",
                       "block_attnres_s4": "block_attnres (N=8)"}


def source(results, key: str) -> dict:
    """The published source `key` ("kimi", "delta", ...); InputError naming the known keys."""
    sources = {s["key"]: s for s in results.json(PUBLISHED)["sources"]}
    if key not in sources:
        raise InputError(f"{PUBLISHED} has no source {key!r}; it has {sorted(sources)}")
    return sources[key]


def kimi_ablation(results) -> dict[str, float]:
    """Kimi's 16-layer ablation losses by our ablation preset's variant names."""
    rows = [r for r in source(results, "kimi")["rows"] if "ablation" in r["label"].lower()]
    if len(rows) != 1:
        raise InputError(f"{PUBLISHED}: expected one Kimi row labelled as the ablation, found {len(rows)}")
    return {KIMI_ABLATION_NAMES[k]: v for k, v in rows[0]["values"].items() if k in KIMI_ABLATION_NAMES}


NAMES = {"standard": "standard", "full_attnres": "Full", "block_attnres": "Block", "delta_attnres": "Delta AttnRes",
         "delta_block": "Delta Block", "mhc": "mHC", "attn_residuals": "AttnRes (form not stated)",
         "hyper_connections": "hyper-connections", "attnres_block": "gated Block AttnRes (nanochat)"}
# Names for the per-variant lines: the table's variants by their full names, and the labels a source keeps for
# settings that are not a project variant as they are (each row's note says what they are).
VARIANT_NAMES = {**NAMES, "full_attnres": "Full AttnRes", "block_attnres": "Block AttnRes",
                 "denseformer": "DenseFormer", "hyper_connections_static": "hyper-connections, static (n=4)",
                 "hyper_connections_no_tanh": "hyper-connections, dynamic without tanh (n=4)",
                 "hyper_connections_n1": "hyper-connections (n=1)", "hyper_connections_n2": "hyper-connections (n=2)",
                 "hyper_connections_n8": "hyper-connections (n=8)",
                 "hyper_connections_n8_no_tanh": "hyper-connections, dynamic without tanh (n=8)",
                 "full_attnres_input_query": "Full AttnRes, input-dependent query",
                 "full_attnres_sigmoid": "Full AttnRes, sigmoid",
                 "full_attnres_no_key_norm": "Full AttnRes, no key norm",
                 "block_attnres_s4": "Block AttnRes, S=4"}


def _number(value) -> str:
    return "-" if value is None else str(value)


def _lower_is_better(source: dict, row: dict) -> bool:
    return row.get("lower_is_better", source["lower_is_better"])


def _in_table(source: dict, row: dict) -> bool:
    """Whether `row` belongs in the loss/perplexity table: not the ablation (the ablation page sets it beside
    ours), not a train loss (not held out), lower is better (downstream accuracies are in `variant_lines`), and
    standard's figure printed (a row of differences only is in `variant_lines`)."""
    label = row["label"].lower()
    return ("ablation" not in label and "train" not in label and _lower_is_better(source, row)
            and row["values"].get("standard") is not None)


def published_table(ctx) -> str:
    """Published results at scale, each row with its source: loss or perplexity of standard and of each
    variant the source reports (lower is better everywhere; accuracies and differences-only rows are in
    `variant_lines`)."""
    import decimal
    import json

    data = json.loads(ctx.results.path(PUBLISHED).read_text(), parse_float=decimal.Decimal)  # as printed: 32.00
    ctx.source(PUBLISHED)
    held_out = [(s, row) for s in data["sources"] for row in s["rows"] if _in_table(s, row)]
    keys = [k for k in NAMES if any(k in row["values"] for _, row in held_out)]
    rows, shown = [], set()
    for s, row in held_out:
        mark = "" if row.get("checked") else " (not checked)"
        cells = [f"[{s['short']}]({s['url']})", row["scale"] + mark, row.get("metric") or s["metric"],
                 *(_number(row["values"].get(k)) for k in keys)]
        if tuple(cells) in shown:
            continue  # the same runs in another of the source's tables, which differ only in settings not shown here
        shown.add(tuple(cells))
        rows.append(cells + [row.get("where") or s["where"]])
    claims = [f"- [{s['short']}]({s['url']}): " + "; ".join(s["claims"]) for s in data["sources"]
              if s["claims"] and s["rows"]]
    header = ["source", "scale", "metric"] + [NAMES[k] for k in keys] + ["read in"]
    unchecked = sum(1 for s in data["sources"] for row in s["rows"] if not row.get("checked"))
    checked = ("A row marked 'not checked' could not be read at its source: its figures are as a summary gave them. "
               if unchecked else "Every figure was read at the source its row names. ")
    return "\n\n".join([table(header, rows), "\n".join(claims),
                        f"*{checked}What was read and what was not, per source: {ctx.source(PUBLISHED)}.*"])


def _entries(source: dict, variant: str) -> list[tuple[str, str]]:
    """(direction, text) for each figure `source` prints for `variant` beside standard, in row order: its value
    and standard's ("1.909 vs 1.931") or the printed difference ("-0.021 vs standard"). A train-loss row is left
    out where a held-out row of the same metric and scale stands beside it; a figure printed twice (the same run
    in two tables) is given once."""
    rows = [r for r in source["rows"] if variant in r["values"] or variant in r.get("delta_vs_standard", {})]
    held_out = {(r["scale"], r.get("metric")) for r in rows if "train" not in r["label"].lower()}
    entries: list[tuple[str, str]] = []
    for row in rows:
        if "train" in row["label"].lower() and (row["scale"], row.get("metric")) in held_out:
            continue
        lower = _lower_is_better(source, row)
        where = (row["scale"] + (" (ablation)" if "ablation" in row["label"].lower() else "")
                 + (f", {row['metric']}" if row.get("metric") else ""))
        mark = "" if row.get("checked") else " (not checked)"
        base, value = row["values"].get("standard"), row["values"].get(variant)
        if value is not None and base is not None:
            difference, text = value - base, f"{value} vs {base}"
        elif variant in row.get("delta_vs_standard", {}):
            difference = row["delta_vs_standard"][variant]
            text = f"{'+' if difference > 0 else ''}{difference} vs standard"
        else:
            continue  # not reported at this scale, or standard's figure not printed beside it
        direction = "same" if difference == 0 else "better" if (difference < 0) == lower else "worse"
        entry = (direction, f"{where}: {text}{mark}")
        if entry not in entries:
            entries.append(entry)
    return entries


def variant_lines(data: dict) -> list[str]:
    """The evidence at scale, one line per source and then one per variant it reports against standard: whether
    the variant is better or worse there and the figures, as printed, at each scale (and metric, where a row names
    its own). A source with no figures gets its line and what it claims. `data`: published.json parsed with
    Decimal floats, so that figures keep their printed digits."""
    lines = []
    for s in data["sources"]:
        head = f"- **[{s['short']}]({s['url']})**"
        variants = list(dict.fromkeys(k for row in s["rows"]
                                      for k in (*row["values"], *row.get("delta_vs_standard", {})) if k != "standard"))
        per_variant = [(k, _entries(s, k)) for k in variants]
        per_variant = [(k, entries) for k, entries in per_variant if entries]
        if not per_variant:
            claims = f"; what it claims: {'; '.join(s['claims'])}" if s["claims"] else ""
            lines.append(f"{head}: no figures recorded (not readable at the source){claims}.")
            continue
        direction = "lower" if s["lower_is_better"] else "higher"
        metric = "" if s["metric"] == "see each row" else f", {s['metric']}, {direction} is better"
        lines.append(f"{head}{metric}: {s['headline']}." if s.get("headline") else f"{head}{metric}.")
        for k, entries in per_variant:
            counts = {d: sum(1 for e, _ in entries if e == d) for d in ("better", "worse", "same")}
            summary = ", ".join(f"{d} in {n}" for d, n in counts.items() if n) + f" of {len(entries)}"
            figures = "; ".join(f"{text} ({d})" for d, text in entries)
            lines.append(f"  - {VARIANT_NAMES.get(k, k)} against standard: {summary}: {figures}")
    return lines


def published_by_variant(ctx) -> str:
    """The evidence-at-scale list for a page: `variant_lines` of results/published/published.json, and where
    each source's figures were read."""
    import decimal
    import json

    data = json.loads(ctx.results.path(PUBLISHED).read_text(), parse_float=decimal.Decimal)
    return "\n".join(variant_lines(data)) + (
        f"\n\n*Figures as printed by each source (higher is better for accuracies; a difference printed without "
        f"standard's figure is shown as one); where each was read, and what could not be: {ctx.source(PUBLISHED)}.*")
