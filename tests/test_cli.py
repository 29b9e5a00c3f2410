"""The `attnres` command line: `python -m attnres` lists the sub-commands."""

import argparse
import subprocess
import sys

import pytest

import attnres
from attnres.cli import build_parser, main
from attnres.residual import VARIANTS


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "attnres", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "compare" in result.stdout and "bench" in result.stdout


def _subcommands(parser):
    """(name, parser) of every subcommand."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices.items())


@pytest.mark.parametrize("name", [name for name, _ in _subcommands(build_parser())])
def test_every_option_has_a_help_line_with_its_choices_and_default(name):
    subparser = dict(_subcommands(build_parser()))[name]
    formatter = subparser._get_formatter()
    for action in subparser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        label = "/".join(action.option_strings) or action.dest
        text = formatter._expand_help(action) if action.help else ""
        assert text.strip(), f"attnres {name} {label} has no help text"
        if action.choices:
            missing = [str(c) for c in action.choices if str(c) not in text]
            assert not missing, f"attnres {name} {label}: help does not list the choices {missing}: {text!r}"
        takes_value = action.option_strings and action.nargs != 0
        if takes_value and not action.required:
            assert "default" in text, f"attnres {name} {label}: help does not say its default: {text!r}"


@pytest.mark.parametrize("name", ["compare", "scaling", "bench"])
def test_preset_help_names_every_bundled_preset(name):
    from attnres.common.config_files import bundled_presets

    parser = dict(_subcommands(build_parser()))[name]
    action = parser._option_string_actions["--preset"]
    text = parser._get_formatter()._expand_help(action)
    presets = bundled_presets(name)
    assert presets and all(preset in text for preset in presets), (presets, text)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnres {attnres.__version__}"


def test_convert_lists_the_variants_and_takes_both_dtype_spellings():
    parser = dict(_subcommands(build_parser()))["convert"]
    assert set(VARIANTS) <= set(parser._option_string_actions["--residual"].choices)
    assert parser.parse_args(["src", "--out", "o", "--dtype", "bfloat16"]).dtype == "bf16"
    assert parser.parse_args(["src", "--out", "o", "--dtype", "bf16"]).dtype == "bf16"
    assert parser.parse_args(["src", "--out", "o"]).dtype == "fp32"
