"""The `attnres` command line: the demo runs end to end and bad input fails clearly."""

import json
import subprocess
import sys

from attnres.cli import main
from attnres.demo import DEMO_VARIANTS

TINY = ["demo", "--steps", "3", "--num-layers", "2", "--hidden-size", "16", "--seq-len", "8", "--batch-size", "2",
        "--vocab-size", "32"]


def test_demo_prints_a_row_per_variant_and_writes_json(tmp_path, capsys):
    out_file = tmp_path / "demo.json"
    assert main(TINY + ["--json", str(out_file)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(DEMO_VARIANTS)
    results = json.loads(out_file.read_text())["results"]
    assert [r["residual"] for r in results] == [name for name, _ in DEMO_VARIANTS]
    for row, line in zip(results, table[1:]):
        assert line.startswith(f"| {row['residual']}")
        assert f"{row['held_out_loss']:.3f}" in line
        if row["residual"] == "standard":
            assert row["max_weight"] is None
        else:
            assert 0 < row["max_weight"] <= 1


def test_demo_rejects_bad_settings(capsys):
    assert main(["demo", "--steps", "0"]) == 2
    assert "DemoSettings.steps must be a positive integer, got 0" in capsys.readouterr().err


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "attnres", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "demo" in result.stdout
