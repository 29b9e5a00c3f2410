"""The command-line reference: each `attnres` subcommand's --help, generated from its parser."""

from __future__ import annotations

import argparse
import os
from unittest import mock

WIDTH = "100"  # argparse wraps at the terminal's width: fixed, so a page does not depend on who renders it


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every `attnres` subcommand's parser by name."""
    from attnres.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_block(name: str):
    """The generator of block `cli-NAME`: that subcommand's --help as a code block."""

    def generate(ctx) -> str:
        with mock.patch.dict(os.environ, {"COLUMNS": WIDTH}):
            text = subparsers()[name].format_help()
        return f"```text\n{text.rstrip()}\n```"

    generate.__doc__ = f"`attnres {name} --help`."
    return generate
