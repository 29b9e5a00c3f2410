"""A table of named rows that a user can extend: the residual variants, the token mixers' layer types."""

from __future__ import annotations

from typing import Generic, TypeVar

from attnres.common.errors import InputError

Row = TypeVar("Row")


class Registry(dict[str, Row], Generic[Row]):
    """name -> row, a dict; `kind` names a row in messages ("residual variant", "layer type").
    Rows carry their own `name`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, row: Row) -> Row:
        """Add `row` under `row.name` (a name already there is an error); returns it."""
        if row.name in self:
            raise InputError(f"{self.kind} {row.name!r} is already registered")
        self[row.name] = row
        return row

    def unregister(self, name: str) -> None:
        """Remove the row called `name` (for tests and experiments); a name not there is an error."""
        if name not in self:
            raise InputError(f"{self.kind} {name!r} is not registered")
        del self[name]
