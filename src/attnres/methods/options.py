"""Typed variant options: each residual variant's own settings as a small frozen dataclass.

A variant's options are declared once, with `option(...)` fields that carry their default, their
allowed values and a line of documentation. Everything else reads them from the dataclass: the
model config validates and stores them, YAML and `--set model.residual_options.NAME=...` set them,
the Hugging Face config saves them, and reports name a variant by the ones that differ from their
defaults. No other code names a variant's option.

    @dataclass(frozen=True)
    class MyOptions(VariantOptions):
        width: int = option(2, "how many sources to keep", minimum=1)
        sharp: bool = option(False, "use a hard maximum")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnres.common.checks import check_bool, check_choice, check_int
from attnres.common.errors import InputError

REQUIRED = dataclasses.MISSING  # `option(REQUIRED, ...)`: no default; the config must give a value


def option(default: Any, doc: str, *, choices: tuple | None = None, minimum: int | None = None,
           kind: type | None = None, nullable: bool = False, label: str | None = None,
           mixer: str | None = None, suggested: Any = None) -> Any:
    """A field of a `VariantOptions` dataclass.

    default: the value when none is given (`REQUIRED`: none; the config must set it).
    doc: one line for the config reference. choices: the allowed values (strings). minimum: the
    smallest allowed integer. kind: bool, int or str (from `default` when omitted). nullable: None
    is allowed (and means "off"). label: how a report names a non-default value, a format string of
    `value` (default "[name=value]"); "" leaves it out of names. mixer: the keyword of the depth
    mixer's constructor this option is passed to (None: it is not a mixer argument). suggested: for
    a required option, the value a tool that must pick one uses (a benchmark's default).
    """
    kind = kind or (None if default is REQUIRED or default is None else type(default))
    if kind not in (bool, int, str):
        raise TypeError(f"option kind must be bool, int or str (give kind= for a required or None default), "
                        f"got {kind!r}")
    metadata = {"doc": doc, "choices": choices, "minimum": minimum, "kind": kind, "nullable": nullable,
                "label": label, "mixer": mixer, "suggested": suggested}
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class VariantOptions:
    """A variant's options; the base class has none. Subclasses declare fields with `option`.

    Values are checked at construction (`check_values`); checks that need the model's depth are
    in `check_model`, which `ModelConfig` calls.
    """

    def __post_init__(self) -> None:
        self.check_values(dataclasses.asdict(self), f"{type(self).__name__}.")

    # -------------------------------------------------------------------- reading the fields

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        """The declared options, in order."""
        return list(dataclasses.fields(cls))

    @classmethod
    def names(cls) -> list[str]:
        """The option names."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def defaults(cls) -> dict:
        """{name: default} of the options that have one."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    @classmethod
    def allowed(cls, name: str, num_layers: int) -> str | None:
        """The allowed values of option `name` for a num_layers-layer model, where they depend on the
        model ("one of [1, 2, 4]"); None where the field's own rule says it all."""
        return None

    @classmethod
    def check_values(cls, values: dict, prefix: str, error: type[Exception] = InputError,
                     num_layers: int | None = None) -> None:
        """Raise `error` naming `prefix` + the option and its allowed values (for a num_layers-layer
        model, where given) unless `values` (a complete {name: value}) are valid."""
        for f in dataclasses.fields(cls):
            try:
                cls._check_value(f, values[f.name], prefix + f.name, error)
            except error:
                hint = None if num_layers is None else cls.allowed(f.name, num_layers)
                if hint is None:
                    raise
                raise error(f"{prefix}{f.name} must be {hint}, got {values[f.name]!r}") from None

    @staticmethod
    def _check_value(f: dataclasses.Field, value, name: str, error: type[Exception]) -> None:
        meta = f.metadata
        if not (value is None and meta["nullable"]):
            if meta["kind"] is bool:
                check_bool(value, name, error=error)
            elif meta["kind"] is int:
                check_int(value, name, minimum=meta["minimum"] if meta["minimum"] is not None else 1, error=error)
            elif meta["choices"] is not None:
                check_choice(value, name, meta["choices"], allow_none=meta["nullable"], error=error)
            elif not isinstance(value, str):
                raise error(f"{name} must be a string, got {value!r}")

    @classmethod
    def from_dict(cls, values: dict | None, prefix: str, error: type[Exception] = InputError,
                  variant: str = "", num_layers: int | None = None) -> "VariantOptions":
        """Build from {name: value}: unknown names and missing required ones are errors naming
        `prefix` and the allowed names (`variant`: the residual value, and `num_layers`: the
        model's depth, for the message)."""
        values = dict(values or {})
        names = cls.names()
        which = f" of residual={variant!r}" if variant else ""
        unknown = sorted(set(values) - set(names), key=str)
        if unknown:
            raise error(f"{prefix.rstrip('.')}: unknown option(s) {unknown}{which}; its options: {names}")
        given = {**cls.defaults(), **values}
        missing = [name for name in names if name not in given]
        if missing:
            hint = None if num_layers is None else cls.allowed(missing[0], num_layers)
            raise error(f"{prefix}{missing[0]} is required{which.replace(' of ', ' for ')}: "
                        f"{cls.doc(missing[0]) if hint is None else hint}")
        cls.check_values(given, prefix, error, num_layers)
        return cls(**given)

    @classmethod
    def suggestions(cls) -> dict:
        """{name: value} of the required options that suggest a value (`option(..., suggested=)`)."""
        return {f.name: f.metadata["suggested"] for f in dataclasses.fields(cls) if f.metadata["suggested"] is not None}

    @classmethod
    def doc(cls, name: str) -> str:
        """The documentation line of option `name`."""
        return next(f.metadata["doc"] for f in dataclasses.fields(cls) if f.name == name)

    def to_dict(self) -> dict:
        """{name: value} of every option (round-trips through `from_dict`)."""
        return dataclasses.asdict(self)

    # -------------------------------------------------------------------- what they mean

    @property
    def partial_source(self) -> bool:
        """Whether the current block's partial sum is one more source (read by the source policy)."""
        return False

    @property
    def gated(self) -> bool:
        """Whether every mixer has a zero-initialised scalar gate."""
        return False

    @classmethod
    def for_depth(cls, values: dict, num_layers: int) -> dict:
        """`values` ({name: value}) adjusted to a num_layers-layer model where an option's valid values
        depend on the depth (a block count moves to the nearest valid one); a benchmark that sweeps
        depths uses it."""
        return values

    def check_model(self, num_layers: int, prefix: str, error: type[Exception] = InputError) -> None:
        """Raise `error` (naming `prefix` + the option) unless the options fit a num_layers-layer model."""

    def mixer_options(self) -> dict:
        """Keyword arguments for the depth mixer's constructor: every option declared with `mixer=`,
        and gated=True where the options ask for a gate."""
        values = {f.metadata["mixer"]: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["mixer"]}
        return {**values, **({"gated": True} if self.gated else {})}

    def fast_paths(self) -> bool:
        """Whether the fast routing paths compute these options (False: only the reference code does)."""
        return True

    def labels(self) -> list[str]:
        """How a report names the options that differ from their defaults, e.g. ["(N=4)", "[sigmoid]"]:
        parenthesised labels (the variant's shape) first, then the others, each in field order."""
        defaults = self.defaults()
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in defaults and value == defaults[f.name] or value is None:
                continue
            label = f.metadata["label"]
            if label is None:
                out.append(f"[{f.name}={value}]")
            elif label:
                out.append(label.format(value=value))
        return sorted(out, key=lambda text: not text.startswith("("))
