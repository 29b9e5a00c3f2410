"""Reading settings the way every command does: a YAML file holding a mapping, and `key=value` overrides
whose value is parsed as YAML (1e-3, true, null, [12, 24])."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import yaml

from attnres.common.errors import InputError

MAX_YAML_VALUES = 100_000  # values a settings file may hold, aliases expanded; a preset holds a few hundred


def bundled_config_dir(kind: str) -> Path:
    """Where the bundled presets of a command live: `configs/<kind>/` in the package (e.g. "compare")."""
    return Path(str(resources.files("attnres") / "configs" / kind))


def bundled_presets(kind: str) -> list[str]:
    """Names of the bundled presets of `kind` (the .yaml files directly in its folder)."""
    return sorted(p.stem for p in bundled_config_dir(kind).glob("*.yaml"))


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives one key twice: YAML forbids it, and PyYAML would keep the second silently."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (a second `train:` section
    would otherwise replace the first without a word)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: later keys override it by design
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the base loader says so
                    continue
                if first is not None:
                    where = f"on line {line}" if first == line else f"on lines {first} and {line}"
                    raise DuplicateKey(f"key {key!r} is given twice, {where}; keep one")
                lines[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(text: str):
    """`yaml.safe_load(text)`, refusing with ValueError a document that nests too deeply for the parser or
    whose aliases expand to more than MAX_YAML_VALUES values (a "billion laughs" document, or one
    that holds itself), so that nothing after it walks or prints an unbounded value, and with
    DuplicateKey (a yaml.YAMLError) a mapping that gives one key twice, naming the key and both lines."""
    try:
        values = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ValueError("it nests too deeply") from None
    count, stack = 0, [values]
    while stack:
        item = stack.pop()
        count += 1
        if count > MAX_YAML_VALUES:
            raise ValueError(f"it holds more than {MAX_YAML_VALUES} values once its aliases (*name) are expanded")
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return values


def read_yaml_mapping(path: str | os.PathLike[str], what: str, expected: str = "a mapping",
                      error: type[Exception] = InputError) -> dict:
    """The mapping YAML file `path` holds ({} for an empty file). Raises `error` naming `what` and the
    path when the file is missing, is not YAML, or does not hold a mapping (described by `expected`)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a folder; give the path of a YAML file")
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        values = load_yaml(path.read_text()) or {}
    except (yaml.YAMLError, ValueError) as problem:  # UnicodeDecodeError and too-long integers are ValueErrors
        raise error(f"{what} {path} is not valid YAML: {problem}") from None
    if not isinstance(values, dict):
        raise error(f"{what} {path} must hold {expected}, got {values!r}")
    return values


def parse_assignment(item: str, what: str, example: str, error: type[Exception] = InputError) -> tuple[str, object]:
    """'key=value' -> (key, value parsed as YAML; "" when empty). Raises `error` ("<what> 'item' must look
    like <example>") for text without a key and "=", or a value that is not valid YAML."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise error(f"{what} {item!r} must look like {example}")
    try:
        return key, load_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError) as problem:
        raise error(f"{what} {item!r}: the value is not valid YAML: {problem}") from None


def read_preset(kind: str, name_or_path: str, keys: tuple[str, ...], expected: str,
                error: type[Exception] = InputError) -> tuple[Path, dict]:
    """(path, mapping) of a preset of command `kind`: a bundled name (`configs/<kind>/NAME.yaml`) or a
    YAML path. Raises `error` for an unknown name (listing the bundled ones), a file that is not a
    mapping (`expected` describes one) and keys outside `keys`."""
    path = Path(name_or_path)
    if not path.suffix:
        path = bundled_config_dir(kind) / f"{name_or_path}.yaml"
        if not path.is_file():
            raise error(f"unknown {kind} preset {name_or_path!r}; available: {bundled_presets(kind)} "
                        f"(or give a path to a preset YAML file)")
    values = read_yaml_mapping(path, f"{kind} preset", expected, error)
    unknown = sorted(set(values) - set(keys), key=str)
    if unknown:
        raise error(f"{kind} preset {path}: unknown key(s) {unknown}; allowed: {', '.join(keys)}")
    return path, values


def prefixed_overrides(overrides, prefix: str, example: str,
                       error: type[Exception] = InputError) -> tuple[dict, list[str]]:
    """Split `key=value` overrides into those starting with `prefix` (e.g. "cost."), parsed into
    {key without the prefix: value}, and the rest, as given."""
    mine = [item for item in overrides if item.strip().startswith(prefix)]
    parsed = dict(parse_assignment(item.strip()[len(prefix):], "--set", example, error) for item in mine)
    return parsed, [item for item in overrides if item not in mine]
