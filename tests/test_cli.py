"""The `attnres` command line: `python -m attnres` lists the sub-commands."""

import subprocess
import sys


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "attnres", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "compare" in result.stdout and "bench" in result.stdout
