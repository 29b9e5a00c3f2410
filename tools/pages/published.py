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
         "delta_block": "Delta Block", "mhc": "mHC", "attn_residuals": "AttnRes (form not stated)"}


def _number(value) -> str:
    return "-" if value is None else str(value)


def published_table(ctx) -> str:
    """Published results at scale, each row with its source: loss or perplexity of standard and of each
    variant the source reports (lower is better everywhere)."""
    import decimal
    import json

    data = json.loads(ctx.results.path(PUBLISHED).read_text(), parse_float=decimal.Decimal)  # as printed: 32.00
    ctx.source(PUBLISHED)
    keys = [k for k in NAMES if any(k in row["values"] for s in data["sources"] for row in s["rows"]
                                    if "ablation" not in row["label"].lower())]
    rows = []
    for s in data["sources"]:
        for row in s["rows"]:
            if "ablation" in row["label"].lower() or "train" in row["label"].lower():
                continue  # the ablation is set beside ours on the ablation page; train losses are not held out
            mark = "" if row.get("checked") else " (not checked)"
            rows.append([f"[{s['short']}]({s['url']})", row["scale"] + mark, s["metric"],
                         *(_number(row["values"].get(k)) for k in keys), row.get("where") or s["where"]])
    claims = [f"- [{s['short']}]({s['url']}): " + "; ".join(s["claims"]) for s in data["sources"]
              if s["claims"] and s["rows"]]
    header = ["source", "scale", "metric"] + [NAMES[k] for k in keys] + ["read in"]
    unchecked = sum(1 for s in data["sources"] for row in s["rows"] if not row.get("checked"))
    checked = ("A row marked 'not checked' could not be read at its source: its figures are as a summary gave them. "
               if unchecked else "Every figure was read at the source its row names. ")
    return "\n\n".join([table(header, rows), "\n".join(claims),
                        f"*{checked}What was read and what was not, per source: {ctx.source(PUBLISHED)}.*"])
