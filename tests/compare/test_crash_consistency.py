"""`attnres compare` killed in the middle of a write: a rerun never reads a half-written record or report
and never trains a finished run again (tests/crash.py kills the child process at a chosen write)."""

import json
from pathlib import Path

import yaml

from attnres.compare.run_comparison import RECORD_FILE
from tests.compare.test_compare_resume import TINY
from tests.crash import Kill, assert_whole, non_atomic_writes, random_kill, run_cli, shared_cache, snapshot

WALL_TIME_KEYS = ("run_dir", "step_time_s", "tokens_per_s")  # where the run was, and how fast the machine was


def run_records(out: Path) -> dict:
    """{variant: its runs' records from results.json, less the wall-time figures}."""
    results = json.loads((out / "results.json").read_text())
    return {v["name"]: [{k: r for k, r in run.items() if k not in WALL_TIME_KEYS} for run in v["runs"]]
            for v in results["variants"]}


def figures(out: Path) -> list[str]:
    """The report's figures (not a killed run's temporary file)."""
    return sorted(p.name for p in (out / "figures").iterdir() if not p.name.startswith("."))


def test_a_killed_compare_reruns_to_the_uninterrupted_result(tmp_path, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()  # traced: this test's folders and the shared data cache
    env = {"ATTNRES_CACHE": shared_cache(tmp_path_factory)}
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({**TINY, "seeds": 1}))  # standard and block_attnres, one seed each

    def compare(out, kill=None):
        return run_cli(["compare", "--preset", str(preset), "--out", str(out)], root, env, kill)

    # uninterrupted: the result to reach, and every file reaches its final name by a rename
    reference = compare(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    assert non_atomic_writes(reference, root) == []
    out = tmp_path / "out"
    standard = out / "runs" / "standard" / "seed0"

    # 1. killed halfway through writing the first run's record, after its training finished
    first = compare(out, Kill("rename", str(standard / RECORD_FILE)))
    assert first.killed, first.stderr
    leftovers = assert_whole(out)  # nothing half-written is visible under a final name
    assert not (standard / RECORD_FILE).exists()
    assert [p.name.startswith(f".{RECORD_FILE}.") for p in leftovers] == [True]  # the half, under its temporary name

    # 2. the rerun resumes that run at its last checkpoint (no step trained again), trains the second run,
    #    and is killed halfway through one of the report's files (a seeded random one)
    kill = random_kill(reference, "rename", "/*", "/runs/*", tmp_path / "reference", out)
    second = compare(out, kill)
    assert second.killed, second.stderr
    assert f"resumed from {standard}/checkpoints/step_00000004 at step 4" in second.stdout, second.stdout
    assert "standard seed 0: step" not in second.stdout
    assert_whole(out)
    records = snapshot(out, RECORD_FILE)
    assert len(records) == 2

    # 3. the rerun reuses both runs, leaves their records as they were, and writes the whole report
    final = compare(out)
    assert final.returncode == 0, final.stderr
    assert "compare: 2 run(s), 2 finished earlier; 0 step(s) to train" in final.stdout, final.stdout
    assert snapshot(out, RECORD_FILE) == records
    assert_whole(out)
    assert run_records(out) == run_records(tmp_path / "reference")  # the same as if never interrupted
    assert figures(out) == figures(tmp_path / "reference")
