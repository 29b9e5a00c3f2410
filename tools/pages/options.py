"""The variant options reference: every variant's options dataclass as a table, from its fields."""

from __future__ import annotations

import dataclasses

from attnres.residual import VARIANTS
from attnres.methods.options import REQUIRED


def _allowed(field: dataclasses.Field) -> str:
    meta = field.metadata
    if meta["choices"]:
        values = ", ".join(f"`{c}`" for c in meta["choices"])
    elif meta["kind"] is bool:
        values = "true, false"
    elif meta["kind"] is int:
        values = "positive" if meta["minimum"] in (None, 1) else f"at least {meta['minimum']}"
    else:
        values = "a string"
    return values + (", or null" if meta["nullable"] else "")


def _default(field: dataclasses.Field) -> str:
    if field.default is REQUIRED:
        return "required"
    if field.default is None:
        return "`null`"
    value = str(field.default).lower() if isinstance(field.default, bool) else field.default
    return f"`{value}`"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def variant_options(ctx) -> str:
    """One table per options class: option, type, default, allowed values, meaning; and which variants take it."""
    classes: dict[type, list[str]] = {}
    for name, variant in VARIANTS.items():
        classes.setdefault(variant.options, []).append(name)
    parts = []
    for kind, names in classes.items():
        fields = dataclasses.fields(kind)
        takes = ", ".join(f"`{name}`" for name in names)
        if not fields:
            parts.append(f"{takes}: no options.")
            continue
        rows = [[f"`{f.name}`", f.metadata["kind"].__name__, _default(f), _allowed(f), f.metadata["doc"]]
                for f in fields]
        parts.append(f"{takes} (`{kind.__name__}`):\n\n" + _table(["option", "type", "default", "allowed values",
                                                                  "meaning"], rows))
    return "\n\n".join(parts)
