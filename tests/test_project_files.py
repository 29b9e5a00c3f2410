"""The files that make attnres usable by someone else: a licence, a citation, a changelog, one version."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnres
from attnres.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_licence_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


def test_citation_is_valid_and_names_this_version_and_both_papers():
    citation = (ROOT / "CITATION.cff").read_text()
    assert f'version: "{attnres.__version__}"' in citation
    assert "2603.15031" in citation and "2605.18855" in citation
    cffconvert = shutil.which("cffconvert") or str(Path(sys.executable).parent / "cffconvert")
    if not Path(cffconvert).exists():
        pytest.fail("cffconvert (the test extra) is not installed: pip install -e '.[dev]'")
    result = subprocess.run([cffconvert, "--validate", "-i", str(ROOT / "CITATION.cff")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_changelog_has_this_version_and_states_the_deprecation_policy():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+) - \d{4}-\d{2}-\d{2}$", changelog, flags=re.M)
    assert versions[0] == attnres.__version__  # the newest release first
    assert "removed in 0.N+1" in changelog


def test_version_flag_prints_the_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnres {attnres.__version__}"
