"""tools/benchmarks/fit_coverage.py: its result file, and configurations read from a longer run's first sweeps."""

import json
import sys
from pathlib import Path

SCRIPT_DIR = Path(__file__).resolve().parents[2] / "tools" / "benchmarks"
sys.path.insert(0, str(SCRIPT_DIR))  # as when run as a script
import fit_coverage  # noqa: E402


def test_the_result_file_records_its_provenance_and_coverage(tmp_path):
    path = fit_coverage.cli(["--draws", "3", "--replicates", "10", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path == tmp_path / "results.json"
    assert {"command", "created", "machine", "code_path", "settings"} <= set(result)
    assert result["command"].endswith("fit_coverage.py --draws 3 --replicates 10 --out " + str(tmp_path))
    (entry,) = result["configurations"]
    assert (entry["method"], entry["sizes"], entry["seeds"], entry["draws"]) == ("residuals", 8, 1, 3)
    assert set(entry["coverage"]) == set(fit_coverage.truth(8))
    assert all(0 <= share <= 1 for share in entry["coverage"].values())


def test_fewer_sweeps_of_the_same_shape_are_the_first_sweeps_of_the_longer_run():
    short, longer = fit_coverage.run_configurations([("cases", 5, 2, 2), ("cases", 5, 2, 3)], replicates=10)
    assert short["first_draws_of"] == 3 and "first_draws_of" not in longer
    assert short["coverage"] == fit_coverage.main("cases", sizes=5, seeds=2, draws=2, replicates=10)
