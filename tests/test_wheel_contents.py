"""The wheel holds the library and nothing else: what a user imports and runs (the attnres package, its
bundled presets and the fused kernel's C++ source), not this repository's page generator, result
files, benchmark or study scripts, tests or docs.

The wheel is built from a copy of the tracked files, so neither an old build/ folder nor untracked
run folders can hide or add a file.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY_ONLY = ("tools/", "pages/", "results/", "benchmarks/", "studies/", "scripts/", "tests/", "docs/")


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout: the wheel is built from the tracked files")
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in listing.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    source = tmp_path_factory.mktemp("source")
    for name in _tracked_files():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(source)], check=True, capture_output=True)
    (wheel,) = out.glob("attnres-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_only_the_attnres_package_and_its_metadata(wheel_names):
    tops = {name.split("/")[0] for name in wheel_names}
    assert "attnres" in tops
    assert all(top == "attnres" or top.endswith(".dist-info") for top in tops), sorted(tops)


def test_no_page_generator_result_file_or_repository_script_is_in_the_wheel(wheel_names):
    library = [name.removeprefix("attnres/") for name in wheel_names if name.startswith("attnres/")]
    assert not [name for name in library if name.startswith(REPOSITORY_ONLY)]
    assert not [name for name in wheel_names if name.endswith((".png", ".log", ".html", ".jsonl", ".sh"))]


def test_what_a_user_imports_and_runs_is_in_the_wheel(wheel_names):
    for needed in ("attnres/__init__.py", "attnres/cli.py", "attnres/cli_arguments.py", "attnres/hf/modeling.py",
                   "attnres/routing/csrc/", "attnres/configs/compare/smoke.yaml"):
        assert any(name.startswith(needed) for name in wheel_names), needed
