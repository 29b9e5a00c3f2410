"""Display names of variants in reports and logs, from a result file's or preset's variant entry."""

from __future__ import annotations

from attnres.residual import VARIANTS, VariantOptions, variant_label
from attnres.residual.legacy import upgrade_model_fields


def variant_name(entry: dict) -> str:
    """Display name of a variant from a result file's or preset's entry (residual and its options,
    flat or under residual_options, in any version's names; a comparison's query_init), e.g.
    "block_attnres (N=4)", "hyper_connections [static]" or "block_attnres (N=8) [q~N(0,0.02)]"."""
    name = variant_label(entry["residual"], entry_options(entry))
    return name + (" [q~N(0,0.02)]" if entry.get("query_init") == "normal" else "")


def entry_options(entry: dict) -> VariantOptions | None:
    """The options object of a result file's or preset's variant entry (see `variant_name`); None for
    a residual no longer in the table."""
    if entry.get("residual") not in VARIANTS:
        return None
    model = {key: value for key, value in entry.items() if key not in ("name", "query_init", "runs")}
    values, _ = upgrade_model_fields(model, flat_options=True)
    kind = VARIANTS[entry["residual"]].options
    return kind.from_dict(values.get("residual_options"), "residual_options.", variant=entry["residual"])
