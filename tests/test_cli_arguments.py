"""The core package needs torch and four small packages; every other use is an install extra, and a
command whose extra is missing names it in one line (attnres.cli_arguments)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnres.cli_arguments import EXTRA_MODULES, missing_extra

ROOT = Path(__file__).resolve().parents[1]
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the pyproject.toml checks are skipped there
    tomllib = None
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"] if tomllib else {}
reads_pyproject = pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11+")
# top-level module -> the distribution that installs it, where the names differ
DISTRIBUTION = {"lm_eval": "lm-eval"}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def extra_names(extra: str) -> set[str]:
    """The distributions an extra brings, following attnres[...] references to other extras."""
    found = set()
    for requirement in PROJECT["optional-dependencies"][extra]:
        inner = re.fullmatch(r"attnres\[([a-z,]+)\]", requirement)
        found |= set().union(*(extra_names(e) for e in inner.group(1).split(","))) if inner else names([requirement])
    return found


@reads_pyproject
def test_the_core_needs_no_heavy_package():
    assert names(PROJECT["dependencies"]) == {"torch", "numpy", "pyyaml", "safetensors", "ninja"}


@reads_pyproject
@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_each_extra_installs_the_modules_it_is_named_for(extra):
    wanted = {DISTRIBUTION.get(module, module) for module in EXTRA_MODULES[extra]}
    assert wanted <= extra_names(extra)


@reads_pyproject
def test_dev_and_its_old_name_test_hold_every_extra():
    everything = set().union(*(extra_names(e) for e in ("hf", "train", "eval")))
    assert everything <= extra_names("dev") == extra_names("test")
    assert {"pytest", "cffconvert"} <= extra_names("dev")


def test_missing_extra_names_the_command_extra_or_none_for_an_unknown_module():
    error = ModuleNotFoundError("No module named 'transformers'", name="transformers")
    assert missing_extra(error, "hf") == ("this needs transformers, which the 'hf' extra installs: "
                                          "pip install 'attnres[hf]'")
    assert "attnres[train]" in missing_extra(ModuleNotFoundError(name="scipy.stats"), "hf")  # hf does not bring it
    assert missing_extra(ModuleNotFoundError(name="attnres.no_such_module"), "train") is None  # a bug: traceback


# Runs the command line in a process where the extras' modules cannot be imported, as after
# `pip install attnres` alone.
BLOCKED = f"""
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {sorted(set().union(*EXTRA_MODULES.values()))!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocked())
from attnres.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_extras(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_without_extras_help_lists_every_command():
    result = without_extras("--help")
    assert result.returncode == 0, result.stderr
    assert all(command in result.stdout for command in ("train", "compare", "convert", "bench", "lm-eval"))


@pytest.mark.parametrize("args, extra", [(["convert", "SRC", "--out", "OUT"], "hf"),
                                         (["train", "--config", "configs/cpu-tiny.yaml"], "train"),
                                         (["bench", "--precision", "fp32"], "train"),
                                         (["lm-eval", "MODEL"], "eval")])
def test_without_extras_a_command_names_its_extra_in_one_line(args, extra):
    result = without_extras(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"pip install 'attnres[{extra}]'" in result.stderr, result.stderr
