"""tools/benchmarks/pipeline_bytes.py: two spawned CPU ranks, one variant; the result file and its rows."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "benchmarks"))  # spawned ranks import it too
import pipeline_bytes  # noqa: E402


def test_the_result_file_holds_measured_and_predicted_bytes(tmp_path, capsys):
    pipeline_bytes.main(["--variants", "delta_block", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    assert {"command", "created", "machine", "code_path", "settings"} <= set(result)
    assert result["settings"]["variants"] == {"delta_block": 4} and result["settings"]["ranks"] == 2
    measured = result["measured"]
    assert [(r["schedule"], r["stages_per_rank"]) for r in measured] == [tuple(s) for s in pipeline_bytes.SCHEDULES]
    for row in measured:  # the script checks each against the layout before it writes
        assert row["uncached_forward"] == row["uncached_backward"] == row["uncached_predicted"]
        assert row["cached_forward"] == row["cached_predicted"] <= row["uncached_forward"]
    assert {r["residual"] for r in result["predicted"]} == set(pipeline_bytes.LARGE_VARIANTS)
    assert "## Measured" in capsys.readouterr().out
