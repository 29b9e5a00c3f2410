"""The spellings that 0.3.0 moved, served until 0.4.0 from one table (CHANGELOG.md's deprecation policy).

A moved module still imports under its old name (`import attnres.train.config`): an import hook
(`MovedModules`, the last finder on `sys.meta_path`) answers for it with a module whose every name is
read from the new module with a DeprecationWarning naming it. A name that moved out of a package
(`attnres.model.FastGenerator`) is served by that package's module `__getattr__`, set here. `install`
runs once, from `attnres/__init__.py`; nothing else in the package mentions an old spelling.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from attnres.common.deprecation import warn_deprecated

SINCE = "0.3.0"

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
    "attnres.report.analyze": "attnres.report.depth_analysis",
    "attnres.report.analyze_plots": "attnres.report.depth_analysis_plots",
    "attnres.report.analyze_report": "attnres.report.depth_analysis_report",
    "attnres.residual.streams": "attnres.residual.stream_scheme",
    "attnres.routing.streams": "attnres.routing.stream_mixer",
    "attnres.train.config": "attnres.train.train_config",
    "attnres.train.cost": "attnres.train.step_cost",
    "attnres.train.init": "attnres.train.starting_model",
}
# package -> {name that moved out of it: the package it lives in now}
MOVED_NAMES = {
    "attnres.model": {name: "attnres.generation" for name in ("FastGenerator", "GenerationResult", "Sampling")},
    "attnres.model.model_config": {name: "attnres.report.variant_names" for name in ("variant_name", "entry_options")},
}


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
        warn_deprecated(f"the module {old}", new, since=SINCE)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def _package_getattr(package: str, names: dict[str, str]):
    """The `__getattr__` of `package`: a name that moved out of it (`names`) is read from its new home,
    with a DeprecationWarning; any other is the usual AttributeError."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warn_deprecated(f"{package}.{name}", f"{names[name]}.{name}", since=SINCE)
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__


def install() -> None:
    """Serve the old spellings: the import hook, and the packages' `__getattr__` for moved names."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
    for package, names in MOVED_NAMES.items():
        importlib.import_module(package).__getattr__ = _package_getattr(package, names)
