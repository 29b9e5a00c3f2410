"""The base class of every error that reports bad input, as opposed to a bug.

`InputError` is raised for something the user or caller gave: a config value, a command-line
argument, a file they named, an argument of a public function. Its message names what is wrong and
what would work, in one line. The `attnres` command prints it as one line and exits 2; any other
exception is a bug (or a failed run) and keeps its traceback.

Each package has its own subclass (`ConfigError`, `RunConfigError`, `DataError`, `ConversionError`,
...), so a caller can catch one package's errors or all input errors at once. InputError is a
ValueError, so code that catches ValueError keeps working. A check that guards an internal
invariant (something only a bug in attnres can break) raises a plain ValueError or AssertionError.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user or caller; the message names the field or argument and what it accepts."""
