"""The study scripts' shards (tools/studies/shards.sh) start a comparison in a new folder, their logs beside
its runs, and one last call writes the report from the shards' runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("bash") is None, reason="the study scripts are bash")
def test_a_sharded_comparison_starts_in_a_new_folder_and_reports_every_run(tmp_path):
    out = tmp_path / "new" / "study"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", f'source tools/studies/shards.sh && compare_in_shards fair_smoke "{out}" 2'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    logs = {p.name: p.read_text() for p in out.glob("shard*.log")}
    assert done.returncode == 0, done.stderr[-2000:] + "".join(logs.values())[-2000:]
    assert sorted(logs) == ["shard0.log", "shard1.log"]
    assert all("did not write" not in log for log in logs.values())
    results = json.loads((out / "results.json").read_text())
    assert {v["residual"]: sorted(r["seed"] for r in v["runs"]) for v in results["variants"]} == {
        "standard": [0, 1], "block_attnres": [0, 1]}
