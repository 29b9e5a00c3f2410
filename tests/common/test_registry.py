"""A registry: rows by name, a name registered once, and a clear error for a name it lacks."""

from dataclasses import dataclass

import pytest

from attnres.common.errors import InputError
from attnres.common.registry import Registry


@dataclass(frozen=True)
class Row:
    name: str
    value: int = 0


def test_rows_register_once_by_name_and_unregister():
    table = Registry("widget")
    row = table.register(Row("a", 1))
    assert row == Row("a", 1) and table["a"] is row and list(table) == ["a"]
    with pytest.raises(InputError, match="widget 'a' is already registered"):
        table.register(Row("a", 2))
    assert table["a"].value == 1
    table.unregister("a")
    assert "a" not in table
    with pytest.raises(InputError, match="widget 'a' is not registered"):
        table.unregister("a")
