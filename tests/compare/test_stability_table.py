"""benchmarks/stability_table.py: the stability grid's table from one comparison per setting."""

import importlib.util
import json
import sys
from pathlib import Path

from tests.report.test_compare_report import make_results

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "stability_table.py"
sys.path.insert(0, str(SCRIPT.parent))  # as when run as a script: it imports study_tables beside it
spec = importlib.util.spec_from_file_location("stability_table", SCRIPT)
stability_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stability_table)


def setting(lr, warmup, spikes):
    results = make_results()
    results["settings"]["train"].update(lr=lr, warmup_steps=warmup)
    for variant in results["variants"]:
        for run, count in zip(variant["runs"], spikes):
            run["stability"] = {"loss_spikes": count, "grad_spikes": 0, "clip_rate": 0.25, "clipped_steps": 5}
    return results


def test_one_row_per_setting_and_variant_in_grid_order(tmp_path):
    for lr, warmup, spikes in ((3e-3, 10, (0, 2)), (1e-3, 60, (1, 0))):
        folder = tmp_path / f"lr{lr:.1e}-warmup{warmup}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(setting(lr, warmup, spikes)))
    del_run = json.loads((tmp_path / "lr1.0e-03-warmup60" / "results.json").read_text())
    del_run["variants"][0]["runs"][1].pop("stability")  # a run without counters shows n/a
    (tmp_path / "lr1.0e-03-warmup60" / "results.json").write_text(json.dumps(del_run))
    stability_table.main(tmp_path)
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| 0.00")]
    assert len(rows) == 6
    assert rows[0].startswith("| 0.001 | 60 | standard | 3.100 ± ") and "| 3.000, 3.200 | 1, n/a |" in rows[0]
    assert rows[3].startswith("| 0.003 | 10 | standard |") and "| 0, 2 | 0, 0 | 25%, 25% |" in rows[3]
