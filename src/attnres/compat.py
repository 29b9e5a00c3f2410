"""The spellings that 0.3.0 moved, served until 0.4.0 from one table (CHANGELOG.md's deprecation policy).

A moved module still imports under its old name (`import attnres.train.config`): an import hook
(`MovedModules`, the last finder on `sys.meta_path`) answers for it with a module whose every name is
read from the new module with a DeprecationWarning naming it. A name that moved out of a package
(`attnres.model.FastGenerator`) is served by that package's module `__getattr__`, set here. A renamed
attribute (`Trainer.routers`), an old call form (KimiDeltaAttention's) and a 0.2.0 use of a value that
changed type (`RunConfig.model` read as a dict) are added to their class once its module is executed
(`AfterImport`). `install` runs once, from `attnres/__init__.py`; nothing else in the
package mentions an old spelling.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import functools
import sys
import warnings

SINCE, REMOVED_IN = "0.3.0", "0.4.0"

# old module -> its name now (issue 41: no two files a reader opens share a name; issue 53: generation
# moved above the model)
MOVED_MODULES = {
    "attnres.bench.config": "attnres.bench.bench_config",
    "attnres.bench.run": "attnres.bench.run_bench",
    "attnres.compare.cost": "attnres.compare.cost_measurement",
    "attnres.compare.run": "attnres.compare.run_comparison",
    "attnres.data.config": "attnres.data.data_config",
    "attnres.data.errors": "attnres.data.data_error",
    "attnres.hf.errors": "attnres.hf.conversion_error",
    "attnres.model.compile_choice": "attnres.generation.compile_choice",
    "attnres.model.config": "attnres.model.model_config",
    "attnres.model.generation": "attnres.generation.fast_generator",
    "attnres.model.init": "attnres.model.init_weights",
    "attnres.model.memory_traffic": "attnres.generation.memory_traffic",
    "attnres.report.analyze": "attnres.analyze.run_analysis",
    "attnres.report.analyze_plots": "attnres.report.depth_analysis_plots",
    "attnres.report.analyze_report": "attnres.report.depth_analysis_report",
    "attnres.residual.streams": "attnres.residual.stream_scheme",
    "attnres.routing.streams": "attnres.methods.stream_mixer",
    # issue 60: the methods left the routing kernels for attnres.methods
    "attnres.routing.depth_average": "attnres.methods.denseformer",
    "attnres.routing.hyper_connections": "attnres.methods.hyper_connections",
    "attnres.routing.mhc": "attnres.methods.mhc",
    "attnres.routing.mixer": "attnres.methods.depth_mixer",
    "attnres.routing.options": "attnres.methods.options",
    "attnres.routing.router": "attnres.methods.router",
    "attnres.train.config": "attnres.train.train_config",
    "attnres.train.cost": "attnres.train.step_cost",
    "attnres.train.init": "attnres.train.starting_model",
}
# package -> {name that moved out of it: the package it lives in now}
MOVED_NAMES = {
    "attnres.model": {name: "attnres.generation" for name in ("FastGenerator", "GenerationResult", "Sampling")},
    "attnres.model.model_config": {name: "attnres.report.variant_names" for name in ("variant_name", "entry_options")},
    "attnres.routing": {name: "attnres.methods" for name in (
        "DepthMixer", "DepthWeightedAverage", "HyperConnection", "ManifoldHyperConnection", "MixerFlops",
        "QUERY_KINDS", "Router", "StreamMixer", "WEIGHT_KINDS")},
    "attnres.model.layers": {"Attention": "attnres.model.attention", "apply_rotary": "attnres.model.attention",
                             "MLP": "attnres.model.mlp", "MixtureOfExperts": "attnres.model.moe",
                             "KimiDeltaAttention": "attnres.model.kda", "LatentAttention": "attnres.model.mla"},
    "attnres.residual.variants": {name: "attnres.methods" for name in (
        "EXACT_CONVERSIONS", "SOURCE_KINDS", "STREAM_IMPLS", "BlockCount", "BlockOptions",
        "DeltaBlockOptions", "Variant", "register_variant", "unregister_variant")},
}


def _expert_routers(trainer):
    return importlib.import_module("attnres.model.moe_balance").expert_routers(trainer.model)


def _moved_attribute(old: str, new: str, read) -> property:
    """A property that warns that `old` is deprecated (use `new`) and returns read(self)."""

    def deprecated(self):
        warn_deprecated(old, new)
        return read(self)

    return property(deprecated, doc=f"Deprecated: {new}.")


def _as_mapping(name: str):
    """A dict method on a ModelConfig: RunConfig.model was a dict of fields before 0.3.0."""

    def method(self, *args):
        warn_deprecated(f"RunConfig.model as a dict ({name})", "its fields as attributes (run.model.hidden_size) "
                        "or run.model.to_dict()")
        return getattr(self.to_dict(), name)(*args)

    return method


def _kda_call_of_0_2_0(forward):
    """KimiDeltaAttention.forward that also takes the call before the token-mixer protocol,
    forward(x, cache, layer_idx, padding_mask), whose arguments land one slot right of the new ones."""

    @functools.wraps(forward)
    def translated(self, x, rope=None, cache=None, layer_idx=0, mask=None, real=None, *, padding_mask=None):
        shifted = (rope is not None and not isinstance(rope, (tuple, list))) or isinstance(cache, int)
        if padding_mask is not None or shifted:
            warn_deprecated("KimiDeltaAttention.forward(x, cache, layer_idx, padding_mask)",
                            "forward(x, rope, cache, layer_idx, mask, real), the token-mixer call (rope and mask "
                            "are ignored)", stacklevel=5)  # the user's line, above nn.Module's two call frames
            if shifted:
                rope, cache, layer_idx, padding_mask = None, rope, cache, (
                    layer_idx if not isinstance(layer_idx, int) else padding_mask)
                layer_idx = layer_idx if isinstance(layer_idx, int) else 0
            real = padding_mask if real is None else real
        return forward(self, x, rope, cache, layer_idx, mask, real)

    return translated


# "module.Class" -> {attribute: (the class) -> what the attribute is until 0.4.0}: a removed attribute
# (a property that warns), an old call form, or dict methods for a value whose type changed
OLD_CLASS_SPELLINGS = {
    "attnres.train.trainer.Trainer": {"routers": lambda cls: _moved_attribute(
        "Trainer.routers", "attnres.model.moe_balance.expert_routers(trainer.model)", _expert_routers)},
    "attnres.train.run_config.RunConfig": {"build_model_config": lambda cls: _moved_attribute(
        "RunConfig.build_model_config", "run.model.with_vocab_size(vocab_size)",
        lambda run: run.model.with_vocab_size)},
    "attnres.model.kda.KimiDeltaAttention": {"forward": lambda cls: _kda_call_of_0_2_0(cls.forward)},
    "attnres.model.model_config.ModelConfig": {
        name: lambda cls, name=name: _as_mapping(name)
        for name in ("__getitem__", "__contains__", "get", "keys", "items")},
}


def _add_old_spellings(module) -> None:
    """Give the classes of `module` their old spellings (OLD_CLASS_SPELLINGS)."""
    for target, spellings in OLD_CLASS_SPELLINGS.items():
        module_name, class_name = target.rsplit(".", 1)
        if module_name == module.__name__:
            cls = getattr(module, class_name)
            for name, make in spellings.items():
                setattr(cls, name, make(cls))


class AfterImport(importlib.abc.MetaPathFinder):
    """The first finder on `sys.meta_path`: a module of OLD_CLASS_SPELLINGS is found by the other
    finders and loaded by its own loader, then given its old spellings."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _patched_modules():
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                spec.loader = _ThenAddOldSpellings(spec.loader)
                return spec
        return None


class _ThenAddOldSpellings(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _add_old_spellings(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and tools
        return getattr(self.loader, name)


def _patched_modules() -> set[str]:
    return {target.rsplit(".", 1)[0] for target in OLD_CLASS_SPELLINGS}


def latent_layer_types(layer_types) -> list[str]:
    """The layer types of a ModelConfig built with `mla` and "full_attention" layers, which in 0.2.0 were
    latent attention: "latent_attention" now (files written that way are read so without a warning:
    attnres.residual.legacy)."""
    warn_deprecated("ModelConfig(mla=..., layer_types=[..., 'full_attention', ...]) for latent attention layers",
                    "'latent_attention' (with mla set, 'full_attention' layers are latent until 0.4.0)",
                    stacklevel=6)  # the user's line, above ModelConfig's __init__ and its checks
    return ["latent_attention" if t == "full_attention" else t for t in layer_types]


def warn_deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """A DeprecationWarning naming `old`, the release that removes it and `new`, attributed to the line
    `stacklevel` frames up (3: the user's line that read a moved name), so Python's default filters
    show it when that line is in the user's own script."""
    warnings.warn(f"{old} is deprecated since attnres {SINCE} and will be removed in {REMOVED_IN}; use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of `MOVED_MODULES` (only those: no file of that name exists any more)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module) -> None:
        module.__getattr__ = _module_getattr(module.__name__, MOVED_MODULES[module.__name__])


def _module_getattr(old: str, new: str):
    """The `__getattr__` of moved module `old`: every name is read from `new`, with a DeprecationWarning
    (dunders, which the import machinery and tools probe, are not)."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        warn_deprecated(f"the module {old}", new)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def _package_getattr(package: str, names: dict[str, str]):
    """The `__getattr__` of `package`: a name that moved out of it (`names`) is read from its new home,
    with a DeprecationWarning; any other is the usual AttributeError."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warn_deprecated(f"{package}.{name}", f"{names[name]}.{name}")
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__


def install() -> None:
    """Serve the old spellings: the import hook, and the packages' `__getattr__` for moved names."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
        sys.meta_path.insert(0, AfterImport())
        for name in _patched_modules() & set(sys.modules):  # imported before this ran
            _add_old_spellings(sys.modules[name])
    for package, names in MOVED_NAMES.items():
        importlib.import_module(package).__getattr__ = _package_getattr(package, names)
