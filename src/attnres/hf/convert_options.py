"""`attnres convert`'s variant options: `--option NAME=VALUE`, and the flags of 0.1.0 that set two of
them (`--num-blocks`, `--exact`; deprecated in 0.2.0), each with a one-line note naming `--option`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from attnres.common.config_files import parse_assignment
from attnres.common.deprecation import deprecation_message
from attnres.common.errors import InputError

# the variant option each deprecated flag set -> the flag
DEPRECATED_FLAGS = {"num_blocks": "--num-blocks", "exact_conversion": "--exact"}


def convert_options(assignments: Iterable[str], deprecated: dict[str, object] | None = None,
                    note: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> dict:
    """{option: value} from `--option NAME=VALUE` items, with the values of the deprecated flags
    ({option: value or None}) merged in, each given one announced through `note`; a deprecated flag
    that contradicts an --option is refused naming both."""
    options = dict(parse_assignment(item, "--option", "NAME=VALUE (e.g. num_blocks=4)") for item in assignments)
    given = {}
    for name, value in (deprecated or {}).items():
        if value is None:
            continue
        flag = DEPRECATED_FLAGS[name]
        note(f"attnres convert: {deprecation_message(f'{flag} {value}', f'--option {name}={value}')}")
        if name in options and str(options[name]) != str(value):
            raise InputError(f"attnres convert: {flag} {value} contradicts --option {name}={options[name]}; give one")
        given[name] = value
    return {**options, **given}
