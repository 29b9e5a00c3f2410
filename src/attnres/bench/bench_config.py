"""BenchConfig: what `attnres bench` measures and at which sizes; YAML presets, --set overrides, validation.

A run's settings are layered: a preset YAML (configs/bench/NAME.yaml or a path), then --quick's
overlay (configs/bench/overlays/quick.yaml), then `--set key=value`, then explicit flags. Each
BenchConfig field carries its command-line flag and help in its metadata; the `bench` parser and
every error message come from there.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path

from attnres.common.checks import check_bool, check_choice, check_int
from attnres.common.config_files import bundled_config_dir, bundled_presets, parse_assignment, read_yaml_mapping
from attnres.common.errors import InputError
from attnres.common.precision import PRECISIONS
from attnres.residual import VARIANTS as residual_variants
from attnres.routing import IMPLS

BASELINE = "standard"
ARCHITECTURES = ("dense", "kimi_linear")  # what the benchmarked decoder is (attnres.bench.model_bench.model_shape)
MIN_REPEATS = 5  # the issue asks for the median of at least 5 repeats
DEFAULT_PRESET = "cpu"


def compared_variants() -> tuple[str, ...]:
    """Every variant of the table now (registered ones included) except the baseline: the default of
    `variants`, read when a BenchConfig is made, so a variant added with `register_variant` is measured."""
    return tuple(name for name in residual_variants if name != BASELINE)


def suggested_options() -> tuple[str, ...]:
    """"NAME=VALUE" of every required variant option that suggests a value: the default of `options`,
    so every variant of the table can be built."""
    values = {name: value for v in residual_variants.values() for name, value in v.options.suggestions().items()}
    return tuple(f"{name}={value}" for name, value in values.items())


def setting(default, help: str, flag: str | None = None, metavar: str | None = None):
    """A BenchConfig field whose command-line flag (default `--field-name`) and help live in its metadata.
    A callable `default` is a factory, called for each new config (and for the help's default)."""
    metadata = {"flag": flag, "help": help, "metavar": metavar}
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and settings of one benchmark run. Validated at construction (InputError naming the flag).

    Main comparison: `variants` (each against `standard`; default: every variant of the table when the
    config is made, registered ones included) at hidden_size x num_layers, batches of batch_size x
    seq_len tokens, decode_tokens generated one at a time after a seq_len prompt.
    Depth sweep: the same variants at each of `depths` layers, sweep_hidden wide, sweep_seq_len long
    (an empty tuple skips it). Router micro-benchmark: router_sources sources of shape
    (router_batch, seq_len, hidden_size). Timings are medians of `repeats` interleaved rounds after
    `warmup` discarded rounds. `options` ("NAME=VALUE" each) are residual options given to every
    variant that has them (`Variant.options`), adjusted to each depth where their valid values depend
    on it (`VariantOptions.for_depth`: a block count moves to the nearest valid one).
    `compiled_decode`: also decode with the static KV cache and the torch.compile'd step
    (`attnres.generation.fast_generator`), compiled once per variant in an untimed setup.
    `threads`: torch's intra-op threads for the run (None: leave torch's setting).
    `preset` and `quick` record where the values came from.
    """

    preset: str = setting(DEFAULT_PRESET, "a bundled preset name or a preset YAML path")
    variants: tuple[str, ...] = setting(compared_variants, "variants to compare with standard, space- or "
                                        "comma-separated", metavar="VARIANT")
    architecture: str = setting("dense", f"one of {list(ARCHITECTURES)}: the dense Qwen3 decoder, or Kimi Linear's "
                                         "experts, latent and delta attention at the same active width")
    hidden_size: int = setting(256, "model width", flag="--hidden", metavar="D")
    num_layers: int = setting(24, "model depth", flag="--layers", metavar="L")
    seq_len: int = setting(256, "tokens per sequence and prompt length")
    batch_size: int = setting(1, "sequences per batch")
    vocab_size: int = setting(4096, "vocabulary of the random tokens")
    options: tuple[str, ...] = setting(suggested_options, "residual options NAME=VALUE, each given to the variants that have it "
                                       "(a block count becomes the nearest valid one at each depth)",
                                       flag="--option", metavar="NAME=VALUE")
    repeats: int = setting(5, f"measured rounds, at least {MIN_REPEATS}")
    warmup: int = setting(2, "discarded rounds first")
    depths: tuple[int, ...] = setting((12, 24, 48), "layer counts of the depth sweep, e.g. 12,24,48; 'none' skips it",
                                      metavar="L")
    sweep_hidden: int = setting(64, "model width in the depth sweep")
    sweep_seq_len: int = setting(128, "sequence length in the depth sweep")
    decode_tokens: int = setting(16, "tokens decoded one at a time")
    compiled_decode: bool = setting(True, "also time decoding with the static KV cache and the compiled step "
                                          "(torch.compile: about a minute per variant on 2 CPU cores)")
    router_sources: int = setting(9, "sources of the router micro-benchmark")
    router_batch: int = setting(32, "batch of the router's (batch, seq-len, hidden) sources")
    precision: str = setting("bf16", f"one of {list(PRECISIONS)}; bf16 runs under autocast")
    routing_impl: str = setting("auto", f"one of {list(IMPLS)}")
    device: str = setting("cpu", "cpu, cuda or cuda:N")
    seed: int = setting(0, "seed of weights and tokens")
    threads: int | None = setting(None, "torch intra-op threads (default: leave torch's setting)")
    quick: bool = setting(False, "whether the --quick overlay was applied")

    def __post_init__(self) -> None:
        check_preset(self.preset)
        check_bool(self.quick, OPTION_NAMES["quick"])
        check_bool(self.compiled_decode, OPTION_NAMES["compiled_decode"], yaml=True)
        for name in ("variants", "depths", "options"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self._check_options()
        for name in ("hidden_size", "num_layers", "seq_len", "batch_size", "vocab_size",
                     "sweep_hidden", "sweep_seq_len", "decode_tokens", "router_sources", "router_batch"):
            check_int(getattr(self, name), OPTION_NAMES[name])
        check_int(self.warmup, OPTION_NAMES["warmup"], minimum=0)
        check_int(self.seed, OPTION_NAMES["seed"], minimum=0)
        if self.threads is not None:  # "None or ..." in the message would suggest typing None on the command line
            check_int(self.threads, OPTION_NAMES["threads"])
        check_int(self.repeats, OPTION_NAMES["repeats"], minimum=MIN_REPEATS,
                  why=f" (the benchmark reports the median of at least {MIN_REPEATS} repeats)")
        for name in ("hidden_size", "sweep_hidden"):
            if getattr(self, name) % 2:
                raise InputError(f"{OPTION_NAMES[name]} must be even (RoPE rotates pairs), got {getattr(self, name)}")
        if not self.variants:
            raise InputError(f"--variants needs at least one of {list(compared_variants())}")
        for variant in self.variants:
            if variant not in compared_variants():
                raise InputError(f"--variants: unknown variant {variant!r}; allowed: {list(compared_variants())} "
                                 f"({BASELINE!r} is always run as the baseline)")
        if len(set(self.variants)) != len(self.variants):
            raise InputError(f"--variants lists a variant twice: {list(self.variants)}")
        for depth in self.depths:
            check_int(depth, f"{OPTION_NAMES['depths']}: every depth")
        check_choice(self.precision, OPTION_NAMES["precision"], PRECISIONS)
        check_choice(self.architecture, OPTION_NAMES["architecture"], ARCHITECTURES)
        check_choice(self.routing_impl, OPTION_NAMES["routing_impl"], IMPLS)
        if not (isinstance(self.device, str)
                and (self.device in ("cpu", "cuda") or self.device.startswith("cuda:"))):
            raise InputError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    def option_values(self) -> dict:
        """`options` as {name: value} (each value parsed as YAML)."""
        return dict(parse_assignment(item, OPTION_NAMES["options"], "NAME=VALUE (e.g. num_blocks=8)")
                    for item in self.options)

    def variant_options(self, residual: str, num_layers: int) -> dict:
        """The options of `residual` at `num_layers` layers: those of `options` it has, for its depth."""
        kind = residual_variants[residual].options
        given = {name: value for name, value in self.option_values().items() if name in kind.names()}
        return kind.for_depth(given, num_layers)

    def _check_options(self) -> None:
        known = {name for v in residual_variants.values() for name in v.options.names()}
        values = self.option_values()
        unknown = sorted(set(values) - known, key=str)
        if unknown:
            raise InputError(f"{OPTION_NAMES['options']}: {unknown} is no option of any variant; the variants' "
                             f"options: {sorted(known)}")
        for residual in self.variants:
            kind = residual_variants[residual].options if residual in residual_variants else None
            missing = [f.name for f in (kind.option_fields() if kind else []) if f.name not in kind.defaults()
                       and f.name not in values]
            if missing:
                raise InputError(f"{OPTION_NAMES['options']}: {residual} needs {missing[0]}; give it as "
                                 f"{OPTION_NAMES['options']} {missing[0]}=VALUE ({kind.doc(missing[0])})")

    def to_dict(self) -> dict:
        """Plain JSON-ready dict of every field (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def flag_name(spec: Field) -> str:
    """The command-line flag of a BenchConfig field: its metadata's, else `--field-name`."""
    return spec.metadata.get("flag") or "--" + spec.name.replace("_", "-")


# Flag of every field, so errors name what the user typed.
OPTION_NAMES = {spec.name: flag_name(spec) for spec in fields(BenchConfig)}
# The fields a preset, --set or a flag sets; `preset` and `quick` pick the layers instead.
SETTING_NAMES = tuple(name for name in OPTION_NAMES if name not in ("preset", "quick"))


def flag_arguments() -> list[tuple[str, dict]]:
    """(flag, argparse keyword arguments) for every setting, generated from BenchConfig's fields.

    The argparse dest is the field name and every default is None, meaning "not given": the
    preset's (or --set's) value stays. Tuple fields take one or more values, each of which may be
    comma-separated; resolve_config parses them. A bool field gets `--field` and `--no-field`.
    """
    hints = typing.get_type_hints(BenchConfig)
    arguments = []
    for spec in fields(BenchConfig):
        if spec.name not in SETTING_NAMES:
            continue
        kwargs = {"dest": spec.name, "default": None, "help": _help_text(spec)}
        if spec.metadata.get("metavar"):
            kwargs["metavar"] = spec.metadata["metavar"]
        hint = hints[spec.name]
        if typing.get_origin(hint) is tuple:
            kwargs["nargs"] = "+"
        elif hint is bool:  # --flag / --no-flag
            kwargs["action"] = argparse.BooleanOptionalAction
        else:  # `int | None` -> int
            kwargs["type"] = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        arguments.append((flag_name(spec), kwargs))
    return arguments


def _help_text(spec: Field) -> str:
    default = spec.default if spec.default_factory is MISSING else spec.default_factory()
    if default is None:
        return spec.metadata["help"]
    shown = ",".join(str(v) for v in default) if isinstance(default, tuple) else default
    return f"{spec.metadata['help']} (default: {shown})"


def preset_dir() -> Path:
    """Where the bundled presets live (`configs/bench/` in the repository)."""
    return bundled_config_dir("bench")


def available_presets() -> list[str]:
    """Names of the bundled presets (overlays such as --quick's, in a sub-folder, are not presets)."""
    return bundled_presets("bench")


def is_preset_path(preset: str) -> bool:
    """Whether `preset` names a file (it has a suffix or a folder) rather than a bundled preset."""
    path = Path(preset)
    return bool(path.suffix) or path.name != preset


def check_preset(preset: object) -> None:
    """InputError unless `preset` is a bundled preset name or a path to a YAML file."""
    if isinstance(preset, str) and (is_preset_path(preset) or preset in available_presets()):
        return
    raise InputError(f"--preset must be one of {available_presets()}, got {preset!r} "
                     f"(or give a path to a preset YAML file)")


def preset_path(preset: str) -> Path:
    """The YAML file of a bundled preset name or a preset path; InputError when there is none."""
    check_preset(preset)
    path = Path(preset) if is_preset_path(preset) else preset_dir() / f"{preset}.yaml"
    if path.is_dir():
        raise InputError(f"--preset: {path} is a folder; give a bundled preset's name or the path of a preset "
                         f"YAML file")
    if not path.is_file():
        raise InputError(f"--preset: preset file {path} does not exist")
    return path


def load_settings(path: str | Path) -> dict:
    """The settings a preset or overlay YAML file holds: a mapping of BenchConfig field names to values."""
    values = read_yaml_mapping(path, "bench preset", "a mapping of settings")
    _check_names(values, f"bench preset {path}: ")
    return values


def parse_set_args(items: Sequence[str]) -> dict:
    """`key=value` strings (--set) -> {key: value}, each value parsed as YAML (12, [12, 24], null, fp32)."""
    values = dict(parse_assignment(item, "--set", "key=value (e.g. repeats=10)") for item in items)
    _check_names(values, "--set: ")
    return values


def _check_names(values: dict, source: str = "") -> None:
    unknown = sorted(set(values) - set(SETTING_NAMES), key=str)
    if unknown:
        raise InputError(f"{source}unknown bench settings {unknown}; allowed: {sorted(SETTING_NAMES)}")


# --quick: a tiny model and few tokens, a run of seconds (see the overlay file for the values).
QUICK_PATH = preset_dir() / "overlays" / "quick.yaml"
QUICK_VALUES = load_settings(QUICK_PATH)


def resolve_config(preset: str = DEFAULT_PRESET, quick: bool = False, set_args: Sequence[str] = (),
                   **overrides) -> BenchConfig:
    """BenchConfig from a preset (name or YAML path), then --quick's overlay, then `set_args`
    ("key=value" strings), then explicit `overrides` (keyword per field; None values ignored).

    `variants` may be given as strings holding comma-separated names; `depths` as "12,24,48"
    (an empty string or "none" skips the depth sweep), or either as a sequence of such items.
    """
    _check_names(overrides)
    values = {**load_settings(preset_path(preset)), **(QUICK_VALUES if quick else {}), **parse_set_args(set_args)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "variants" in values:
        values["variants"] = parse_names(values["variants"])
    if "depths" in values:
        values["depths"] = parse_depths(values["depths"])
    if "options" in values:
        values["options"] = parse_names(values["options"], OPTION_NAMES["options"], "NAME=VALUE items like num_blocks=8")
    return BenchConfig(preset=preset, quick=quick, **values)


def parse_names(value, flag: str = "--variants", what: str = "variant names like block_attnres,delta_block"
                ) -> tuple[str, ...]:
    """'a,b' or ['a', 'b,c'] -> ('a', 'b', 'c'); blanks dropped."""
    if not isinstance(value, (str, list, tuple)):
        raise InputError(f"{flag} must be {what}, got {value!r}")
    items = [value] if isinstance(value, str) else list(value)
    return tuple(name.strip() for item in items for name in str(item).split(",") if name.strip())


def parse_depths(value) -> tuple:
    """'12,24,48', ['12', '24,48'] or [12, 24, 48] -> (12, 24, 48); 'none', '' or [] -> () (no depth sweep).

    Items that are not text pass through unchanged for BenchConfig to check.
    """
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    parts = [part.strip() if isinstance(part, str) else part
             for item in items for part in (item.split(",") if isinstance(item, str) else [item])]
    parts = [part for part in parts if part != ""]
    if len(parts) == 1 and isinstance(parts[0], str) and parts[0].lower() == "none":
        return ()
    return tuple(_parse_depth(part, value) for part in parts)


def _parse_depth(part, whole):
    if not isinstance(part, str):
        return part
    try:
        return int(part)
    except ValueError:
        raise InputError(f"--depths must be comma-separated positive integers like 12,24,48 (or 'none'), "
                         f"got {whole!r}") from None
