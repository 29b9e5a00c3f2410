"""The `attnres` command line: `python -m attnres` lists the sub-commands."""

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import attnres
from attnres import cli
from attnres.cli import build_parser, main
from attnres.common.errors import InputError
from attnres.model import ConfigError
from attnres.residual import VARIANTS
from attnres.train import CheckpointError, RunConfigError, TrainingError


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
        if action.help == argparse.SUPPRESS:  # a deprecated spelling, hidden (tests/test_deprecations.py)
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


CPU_TINY = str(Path(attnres.__file__).parent / "configs" / "cpu-tiny.yaml")


@pytest.mark.parametrize("argv, message", [
    (["train", "--config", CPU_TINY, "--set", "model.num_blocks=5"],
     "ModelConfig.residual_options.num_blocks=5 gives blocks of"),
    (["train", "--config", CPU_TINY, "--set", "train.lr=-1"], "TrainConfig.lr must be a positive number, got -1"),
    (["train", "--config", "absent.yaml"], "absent.yaml does not exist"),
    (["compare", "--preset", "nosuch"], "unknown compare preset 'nosuch'"),
    (["bench", "--repeats", "2"], "--repeats must be an integer >= 5"),
    (["generate", "no/such/model", "--prompt", "Hi"],
     "MODEL 'no/such/model': no/such/model/config.json does not exist"),
])
def test_bad_input_exits_2_with_one_line_naming_it(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a run might write lands in the checkout
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnres {argv[0]}: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line, no traceback


def _raise(error):
    def handler(args):
        raise error
    return handler


def handle(monkeypatch, command: str, handler) -> None:
    """Give `command`'s row of the command table another handler, for this test."""
    monkeypatch.setitem(cli.COMMANDS, command, dataclasses.replace(cli.COMMANDS[command], handler=handler))


def test_a_plain_value_error_in_a_handler_is_a_bug_and_keeps_its_traceback(monkeypatch, capsys):
    # An internal ValueError (not an InputError) must not be turned into "bad input": it propagates.
    handle(monkeypatch, "bench", _raise(ValueError("an internal invariant broke")))
    with pytest.raises(ValueError, match="an internal invariant broke") as raised:
        main(["bench"])
    assert not isinstance(raised.value, InputError)
    assert capsys.readouterr().err == ""  # nothing printed as if it were the user's error


def test_the_same_error_from_the_command_shows_a_traceback(tmp_path):
    """End to end through `python -m attnres`: a bug exits 1 with Python's traceback."""
    code = ("import dataclasses, sys, attnres.cli as cli\n"
            "def broken(args):\n"
            "    raise ValueError('an internal invariant broke')\n"
            "cli.COMMANDS['eval'] = dataclasses.replace(cli.COMMANDS['eval'], handler=broken)\n"
            "sys.exit(cli.main(['eval', 'anything']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "in broken" in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: an internal invariant broke")


@pytest.mark.parametrize("error, code", [
    (ConfigError("ModelConfig.num_layers must be a positive integer, got 0"), 2),
    (RunConfigError("train.steps must be a positive integer, got 0"), 2),
    (InputError("--prompt must be a non-empty text"), 2),
    (CheckpointError("checkpoint runs/x is corrupt"), 1),
    (TrainingError("non-finite loss at step 3"), 1),
])
def test_input_errors_exit_2_and_failed_runs_exit_1_in_one_line(monkeypatch, capsys, error, code):
    handle(monkeypatch, "eval", _raise(error))
    assert main(["eval", "anything"]) == code
    assert capsys.readouterr().err == f"attnres eval: error: {error}\n"


def test_a_failed_run_is_a_bug_where_the_command_loads_no_checkpoints(monkeypatch):
    # CheckpointError means a bad checkpoint only for the commands that load them; elsewhere it propagates.
    handle(monkeypatch, "bench", _raise(CheckpointError("unexpected")))
    with pytest.raises(CheckpointError):
        main(["bench"])
