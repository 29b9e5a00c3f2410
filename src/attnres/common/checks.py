"""Value checks for configs and options: one wording for every "must be ..., got ..." error.

Each check raises `error` (by default `InputError`; a caller passes its own subclass of it) with a
message that starts with `name`, so the message names what the user wrote: "ModelConfig.num_layers",
"--repeats", "train.pipeline.cache", ...
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from attnres.common.errors import InputError


def is_int(value: object) -> bool:
    """An int and not a bool (True is an int to Python, never to a config)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or float and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: object, name: str, *, minimum: int = 1, allow_none: bool = False, why: str = "",
              error: type[Exception] = InputError) -> None:
    """Raise `error` unless `value` is an integer >= minimum (or None when allow_none).

    "<name> must be a positive integer, got 0" (minimum 1), "<name> must be an integer >= 5<why>, got 3".
    """
    if value is None and allow_none:
        return
    if is_int(value) and value >= minimum:
        return
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise error(f"{name} must be {'None or ' if allow_none else ''}{kind}{why}, got {value!r}")


def check_positive_number(value: object, name: str, *, error: type[Exception] = InputError) -> None:
    """Raise `error` unless `value` is a finite number > 0: "<name> must be a positive number, got -1"
    (inf and nan are refused too: no setting of attnres means anything at infinity)."""
    if not (is_number(value) and 0 < value < math.inf):
        raise error(f"{name} must be a positive number, got {value!r}")


def check_choice(value: object, name: str, choices: Iterable, *, allow_none: bool = False,
                 error: type[Exception] = InputError) -> None:
    """Raise `error` unless `value` is one of `choices`: "<name> must be one of ['a', 'b'], got 'c'"."""
    choices = list(choices)
    if (value is None and allow_none) or value in choices:
        return
    raise error(f"{name} must be {'None or ' if allow_none else ''}one of {choices}, got {value!r}")


def divisors_hint(number: int, limit: int = 4096, up_to: int | None = None) -> str:
    """The values that divide `number`, for a "must divide" message: the list of its divisors (those
    up to `up_to`, when given), or for a number above `limit` (whose divisors would take long to list)
    the words "the divisors of <number>"."""
    top = number if up_to is None else up_to
    if number > limit:
        return f"the divisors of {number}" + ("" if up_to is None else f" up to {up_to}")
    return str([d for d in range(1, top + 1) if number % d == 0])


def check_bool(value: object, name: str, *, error: type[Exception] = InputError, yaml: bool = False) -> None:
    """Raise `error` unless `value` is a bool: "<name> must be True or False" (YAML spelling with yaml=True)."""
    if not isinstance(value, bool):
        words = "true or false" if yaml else "True or False"
        raise error(f"{name} must be {words}, got {value!r}")


def dataclass_from_dict(cls, values, name: str):
    """`cls` (a frozen options dataclass) from itself or a dict of its fields; InputError naming
    unknown fields and the allowed ones."""
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise InputError(f"{name} must be a mapping of {cls.__name__} fields, got {type(values).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(values) - known, key=str)
    if unknown:
        raise InputError(f"{cls.__name__}: unknown field(s) {unknown}; allowed fields: {sorted(known)}")
    required = required_fields(cls)
    missing = [name for name in required if name not in values]
    if missing:
        raise InputError(f"{cls.__name__}: missing field(s) {missing}; required fields: {required}")
    return cls(**values)


def required_fields(cls) -> list[str]:
    """The fields of dataclass `cls` without a default, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
