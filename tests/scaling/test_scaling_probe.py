"""tools/benchmarks/scaling_probe.py: a sweep's runs against the same runs on another floating-point path."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "benchmarks" / "scaling_probe.py"
spec = importlib.util.spec_from_file_location("scaling_probe", SCRIPT)
scaling_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scaling_probe)


def results(losses: dict, capability: str) -> dict:
    """losses: {(variant, size, seed): loss}."""
    names = sorted({k[0] for k in losses})
    return {"command": "attnres scaling --preset cpu", "machine": {"cpu_capability": capability},
            "variants": [{"name": n, "runs": [{"size": s, "seed": seed, "final_val_loss": loss}
                                              for (v, s, seed), loss in losses.items() if v == n]} for n in names]}


SWEEP = {("standard", "a", 0): 5.00, ("standard", "a", 1): 5.10, ("block", "a", 0): 4.90, ("block", "a", 1): 5.00,
         ("standard", "b", 0): 4.00, ("block", "b", 0): 4.05}
PROBE = {("standard", "a", 0): 5.02, ("block", "a", 0): 4.93, ("standard", "b", 0): 4.00, ("block", "b", 0): 3.98}


def test_rows_pair_runs_and_differences():
    rows = scaling_probe.paired_rows(results(SWEEP, "AVX512"), results(PROBE, "AVX2"))
    assert [(r["size"], r["variant"], r["seed"]) for r in rows] == [("a", "standard", 0), ("a", "block", 0),
                                                                    ("b", "standard", 0), ("b", "block", 0)]
    block_a = rows[1]
    assert block_a["moved"] == pytest.approx(0.03)
    assert block_a["diff_sweep"] == pytest.approx(-0.10) and block_a["diff_probe"] == pytest.approx(-0.09)
    assert rows[0]["diff_sweep"] is None


def test_seed_spread_pools_the_variants_of_a_size():
    spread = scaling_probe.seed_spread_by_size(results(SWEEP, "AVX512"))
    assert set(spread) == {"a"}  # b has one seed
    assert spread["a"] == pytest.approx(((0.05 ** 2 * 2 + 0.05 ** 2 * 2) / 2) ** 0.5)


def test_markdown_names_the_kernels_and_the_sign_flips(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "probe").mkdir()
    (tmp_path / "sweep" / "results.json").write_text(json.dumps(results(SWEEP, "AVX512")))
    (tmp_path / "probe" / "results.json").write_text(json.dumps(results(PROBE, "AVX2")))
    assert scaling_probe.main([str(tmp_path / "sweep"), str(tmp_path / "probe")]) == 0
    text = (tmp_path / "probe" / "probe.md").read_text()
    assert "`AVX512` CPU kernels" in text and "`AVX2`" in text
    assert "moved final losses by 0.0700 nats at most" in text
    assert "1 of 2 changed sign: block at b seed 0." in text  # +0.05 on the sweep, -0.02 on the probe


def test_no_shared_run_is_an_error():
    with pytest.raises(ValueError, match="share no run"):
        scaling_probe.probe_markdown(results(SWEEP, "x"), results({("standard", "z", 0): 1.0}, "y"), "s", "p")
