"""On a GPU, "auto" routes with the ops PyTorch runs everywhere until the Triton kernel has been checked
on a real GPU; tools/benchmarks/gpu_check.py is that check (run here on CPU, where it must pass too)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnres.routing import route
from attnres.routing.route import resolve_impl

ROOT = Path(__file__).resolve().parents[2]


def test_auto_on_cuda_is_lean_not_triton(monkeypatch):
    monkeypatch.setattr(route, "triton_available", lambda: True)  # as on a GPU machine with Triton
    assert resolve_impl("auto", torch.device("cuda")) == "lean"
    assert resolve_impl("auto", torch.device("cuda:1")) == "lean"


def test_the_switch_lets_auto_pick_triton_on_cuda(monkeypatch):
    monkeypatch.setattr(route, "triton_available", lambda: True)
    monkeypatch.setattr(route, "TRITON_IN_AUTO", True)
    assert resolve_impl("auto", torch.device("cuda")) == "triton"


def test_triton_stays_available_by_name(monkeypatch):
    monkeypatch.setattr(route, "triton_available", lambda: True)
    assert resolve_impl("triton", torch.device("cuda")) == "triton"


def test_gpu_check_script_gives_one_verdict_per_variant_and_path(tmp_path):
    out = tmp_path / "verdicts.json"
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny",
                             "--repeats", "1", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    paths = {row["path"] for row in rows}
    assert {"reference", "lean"} <= paths
    assert len(rows) == 4 * len(paths)  # four routed variants
    verdicts = [line for line in result.stdout.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert len(verdicts) == len(rows) and all(line.endswith("PASS") for line in verdicts)
    assert all(row["step_vs_standard"] > 0 for row in rows)
    assert result.stdout.splitlines()[-1] == "gpu_check: every path passed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_gpu_check_without_a_gpu_says_so_in_one_line():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmarks" / "gpu_check.py")], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 2
    assert result.stdout.strip().count("\n") == 0 and "no CUDA device" in result.stdout
