"""Converting a pretrained model (results/conversion: SmolLM2-135M through `attnres convert`): how far each
variant's logits move from the source's at step 0, and held-out perplexity before any training."""

from __future__ import annotations

from attnres.report.variant_names import variant_name
from tools.pages.seeds import table
from tools.pages.sources import provenance
from attnres.report.document import fmt

CONVERSION, STEP0 = "conversion/results.json", "conversion/step0.json"
CLOSE = 0.01  # a logit difference below this share of the largest logit, every argmax kept: "to the norm's eps"


def _label(entry: dict) -> str:
    return variant_name(entry)


def verdict(entry: dict) -> str:
    """Whether one converted variant starts as the source: 'yes, bit for bit', 'yes, to the RMSNorm eps'
    (every argmax kept, logits within a small share of the largest) or 'no'."""
    gap, largest, same = entry["max_abs_logit_diff"], entry["max_abs_logit"], entry["same_argmax_fraction"]
    if gap == 0:
        return "yes, bit for bit"
    return "yes, to the RMSNorm eps" if same == 1 and gap < CLOSE * largest else "no"


def _float32(results: dict) -> list[dict]:
    """The converted variants compared with the source (the bf16 row records only its file size)."""
    return [e for e in results["variants"] if e.get("dtype", "float32") == "float32"]


def exact_conversion(results) -> dict[str, str]:
    """residual -> the `verdict` of its plain conversion, and the exact-conversion options that make it
    start bit for bit."""
    variants = _float32(results.json(CONVERSION))
    out = {}
    for entry in (e for e in variants if not e.get("exact_conversion")):
        out.setdefault(entry["residual"], verdict(entry))
    for entry in (e for e in variants if e.get("exact_conversion") and e["max_abs_logit_diff"] == 0):
        out[entry["residual"]] += f"; with `exact_conversion: {entry['exact_conversion']}`, bit for bit"
    return out


def conversion_table(ctx) -> str:
    """Every converted variant against the source model: logits, argmax, greedy answers, special tokens."""
    results = ctx.results.json(CONVERSION)
    answers = len(results["settings"]["questions"])
    rows = [[_label(e), verdict(e), fmt(e["max_abs_logit_diff"], ".3g"), f"{e['same_argmax_fraction']:.0%}",
             f"{e['answers_equal']} of {answers}", "yes" if e["special_ids_equal"] else "no"]
            for e in _float32(results)]
    header = ["variant", "exact?", "max abs logit difference", "same argmax", "greedy answers equal",
              "special tokens kept"]
    return "\n\n".join([table(header, rows), provenance(results, ctx.source(CONVERSION))])


def step0_table(ctx) -> str:
    """Held-out perplexity of each converted variant before any training, against standard's."""
    results = ctx.results.json(STEP0)
    base = next(e["perplexity"] for e in results["variants"] if e["residual"] == "standard"
                and not e.get("exact_conversion"))
    rows = [[_label(e), f"{e['perplexity']:.3f}", f"{(e['perplexity'] / base - 1):+.2%}"] for e in results["variants"]]
    return "\n\n".join([table(["variant", "held-out perplexity at step 0", "vs standard"], rows),
                        provenance(results, ctx.source(STEP0))])
