"""tools/setup_env.sh (the set-up of both README commands) says what it is doing, stage by stage,
and shows a failing stage's output. pip is replaced by a stub, so nothing is installed; PATH holds
only the tools the script uses, and a stand-in C++ compiler unless a test hides it."""

import os
import shutil
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
# What the script and the stub run; no compiler among them.
TOOLS = ("bash", "cat", "cp", "cut", "dirname", "grep", "head", "mkdir", "mktemp", "rm", "sed", "sha256sum",
         "sleep", "tail")
NO_COMPILER = "fused CPU routing kernel off: no C++ compiler found"


def tools_dir(tmp_path, compiler: bool) -> Path:
    """A folder for PATH with the tools linked in, and a stand-in `c++` when `compiler`."""
    folder = tmp_path / ("bin-cxx" if compiler else "bin")
    if not folder.is_dir():
        folder.mkdir()
        for tool in TOOLS:
            (folder / tool).symlink_to(shutil.which(tool))
        if compiler:
            (folder / "c++").write_text("#!/usr/bin/env bash\nexit 0\n")
            (folder / "c++").chmod(0o755)
    return folder


def run_setup(tmp_path, compiler=True, **env):
    """The script with the stub for python; the fused extension's build stage is off unless env turns it on."""
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "CXX"}
    env = {"ATTNRES_BUILD_FUSED_CPU": "0", "PATH": str(tools_dir(tmp_path, compiler)), **env}
    return subprocess.run(["bash", str(ROOT / "tools" / "setup_env.sh")], capture_output=True, text=True,
                          env={**base, "PYTHON": str(stub), "ATTNRES_VENV": str(tmp_path / "venv"), **env},
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
    assert "ready:" in result.stderr.splitlines()[-1] and NO_COMPILER not in result.stderr
    (tmp_path / "again").mkdir()
    failed = run_setup(tmp_path / "again", ATTNRES_BUILD_FUSED_CPU="1", STUB_FAIL="fused_cpu_build")
    assert failed.returncode == 3 and "FAILED: building the fused CPU routing extension" in failed.stderr
    # With a compiler, a failed build is an error, and the way to set up without the kernel is named.
    assert failed.stderr.splitlines()[-1] == (
        "attnres setup: to set up without the fused CPU kernel (routing_impl 'auto' then uses the lean PyTorch "
        "ops), run again with ATTNRES_BUILD_FUSED_CPU=0")


def test_without_a_compiler_the_set_up_passes_and_says_once_that_the_kernel_is_off(tmp_path):
    result = run_setup(tmp_path, compiler=False, ATTNRES_BUILD_FUSED_CPU="1")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if NO_COMPILER in line]
    assert said == ["attnres setup: fused CPU routing kernel off: no C++ compiler found (CXX is unset and c++ is "
                    "not on PATH); routing_impl 'auto' uses the lean PyTorch ops instead. To turn it on, install "
                    "g++ (Debian/Ubuntu: apt-get install g++) and run this set-up again (or: python -m "
                    "attnres.routing.fused_cpu_build)"]
    assert "building the fused CPU routing extension" not in result.stderr
    assert "ready:" in result.stderr.splitlines()[-1]
    again = run_setup(tmp_path, compiler=False, ATTNRES_BUILD_FUSED_CPU="1")  # said once, not at every run
    assert again.returncode == 0 and NO_COMPILER not in again.stderr
    assert again.stderr.strip().endswith("is up to date")
    # A compiler installed later: the next set-up builds the kernel.
    later = run_setup(tmp_path, ATTNRES_BUILD_FUSED_CPU="1")
    assert later.returncode == 0 and "building the fused CPU routing extension" in later.stderr


def test_cxx_names_the_compiler_as_for_torchs_build(tmp_path):
    # torch.utils.cpp_extension calls $CXX when it is set, whatever c++ is on PATH.
    missing = run_setup(tmp_path, ATTNRES_BUILD_FUSED_CPU="1", CXX="/nowhere/g++-99")
    assert missing.returncode == 0, missing.stderr
    assert f"{NO_COMPILER} (CXX=/nowhere/g++-99 is not on PATH)" in missing.stderr
    assert "building the fused CPU routing extension" not in missing.stderr
    (tmp_path / "wrapped").mkdir()
    wrapped = run_setup(tmp_path / "wrapped", ATTNRES_BUILD_FUSED_CPU="1", CXX="c++ -fdiagnostics-color")
    assert wrapped.returncode == 0 and "building the fused CPU routing extension" in wrapped.stderr
