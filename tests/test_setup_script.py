"""scripts/setup_env.sh (the set-up of both README commands) says what it is doing, stage by stage,
and shows a failing stage's output. pip is replaced by a stub, so nothing is installed."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A stand-in for python3: `-m venv DIR` makes DIR/bin/python (this stub again); `-m pip install ARGS`
# prints a line like pip's and fails when ARGS contain $STUB_FAIL.
STUB = """#!/usr/bin/env bash
if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
echo "Collecting ${@: -1}"
if [ -n "${STUB_FAIL:-}" ] && [[ "$*" == *"$STUB_FAIL"* ]]; then echo "ERROR: no such package"; exit 3; fi
"""


def run_setup(tmp_path, **env):
    """The script with the stub for python; the fused extension's build stage is off unless env turns it on."""
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {"ATTNRES_BUILD_FUSED_CPU": "0", **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(stub), "ATTNRES_VENV": str(tmp_path / "venv"), **env},
                          timeout=60)


def test_first_set_up_prints_every_stage(tmp_path):
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("attnres setup:")]
    stages = [line for line in lines if line.endswith("...")]
    assert len(stages) == 4  # the venv, torch, the pinned requirements, attnres itself
    assert "creating the virtual environment" in stages[0] and "torch 2.13.0" in stages[1]
    assert "requirements/test.txt" in stages[2] and "attnres itself" in stages[3]
    assert sum("done in" in line for line in lines) == 4 and "ready:" in lines[-1]
    assert "Collecting" not in result.stderr  # pip's own output stays quiet when all goes well
    again = run_setup(tmp_path)  # nothing to do the second time, and it says so
    assert again.returncode == 0 and again.stderr.strip().endswith("is up to date")


def test_a_failing_stage_shows_its_output_and_fails(tmp_path):
    result = run_setup(tmp_path, STUB_FAIL="requirements/test.txt")
    assert result.returncode == 3
    assert "ERROR: no such package" in result.stderr
    assert "FAILED: 2/3" in result.stderr and "attnres itself" not in result.stderr


def test_the_fused_extension_is_built_after_attnres_and_a_failed_build_fails(tmp_path):
    result = run_setup(tmp_path, ATTNRES_BUILD_FUSED_CPU="1")
    assert result.returncode == 0, result.stderr
    stages = [line for line in result.stderr.splitlines() if line.startswith("attnres setup:") and line.endswith("...")]
    assert len(stages) == 5 and "attnres itself" in stages[3] and "fused CPU routing extension" in stages[4]
    assert "ready:" in result.stderr.splitlines()[-1]
    (tmp_path / "again").mkdir()
    failed = run_setup(tmp_path / "again", ATTNRES_BUILD_FUSED_CPU="1", STUB_FAIL="fused_cpu_build")
    assert failed.returncode == 3 and "FAILED: building the fused CPU routing extension" in failed.stderr
