"""`attnres scaling` killed in the middle of a write: a rerun never reads a half-written record or report
and never trains a finished run again (tests/crash.py kills the child process at a chosen write)."""

import json
from pathlib import Path

import yaml

from attnres.scaling.sweep import RECORD_FILE
from tests.crash import Kill, assert_whole, non_atomic_writes, random_kill, run_cli, shared_cache, snapshot
from tests.scaling.test_sweep import TWO_SIZES

WALL_TIME_KEYS = ("run_dir", "step_time_s")  # where the run was, and how fast the machine was


def results(out: Path) -> tuple[dict, dict]:
    """(every run's record, less the wall-time figures, by variant; the fit) from results.json."""
    saved = json.loads((out / "results.json").read_text())
    runs = {v["name"]: [{k: r for k, r in run.items() if k not in WALL_TIME_KEYS} for run in v["runs"]]
            for v in saved["variants"]}
    return runs, saved["fit"]


def figures(out: Path) -> list[str]:
    """The report's figures (not a killed run's temporary file)."""
    return sorted(p.name for p in (out / "figures").iterdir() if not p.name.startswith("."))


def test_a_killed_scaling_sweep_reruns_to_the_uninterrupted_result(tmp_path, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()  # traced: this test's folders and the shared data cache
    env = {"ATTNRES_CACHE": shared_cache(tmp_path_factory)}
    preset = tmp_path / "two.yaml"
    # 2 sizes x 2 variants, one seed, 4 and 10 steps
    preset.write_text(yaml.safe_dump({**TWO_SIZES, "rules": {**TWO_SIZES["rules"], "tokens_per_parameter": 0.03}}))

    def scaling(out, kill=None):
        return run_cli(["scaling", "--preset", str(preset), "--out", str(out), "--replicates", "20",
                        "--cost-repeats", "0"], root, env, kill)

    # uninterrupted: the result to reach, and every file reaches its final name by a rename
    reference_dir, out = tmp_path / "reference", tmp_path / "out"
    reference = scaling(reference_dir)
    assert reference.returncode == 0, reference.stderr
    assert non_atomic_writes(reference, root) == []
    order = [Path(e[1]).parent.relative_to(reference_dir) for e in reference.events
             if e[0] == "rename" and e[1].endswith("/" + RECORD_FILE)]  # the runs in the order they finished
    assert len(order) == 4
    first_run, second_run = out / order[0], out / order[1]

    # 1. killed halfway through writing the second run's record, after its training finished
    first = scaling(out, Kill("rename", str(second_run / RECORD_FILE)))
    assert first.killed, first.stderr
    leftovers = assert_whole(out)  # nothing half-written is visible under a final name
    assert [p.parent for p in out.rglob(RECORD_FILE)] == [first_run]
    assert [p.name.startswith(f".{RECORD_FILE}.") for p in leftovers] == [True]  # the half, under its temporary name

    # 2. the rerun reuses the first run, resumes the second at its last checkpoint (no step trained again),
    #    trains the other two and is killed halfway through one of the report's files (a seeded random one)
    kill = random_kill(reference, "rename", "/*", "/runs/*", reference_dir, out)
    second = scaling(out, kill)
    assert second.killed, second.stderr
    assert "scaling: 4 run(s), 1 finished earlier;" in second.stdout, second.stdout
    assert f"resumed from {second_run}/checkpoints/" in second.stdout
    assert_whole(out)
    records = snapshot(out, RECORD_FILE)
    assert len(records) == 4

    # 3. the rerun reuses every run, leaves their records as they were, and writes the whole report
    final = scaling(out)
    assert final.returncode == 0, final.stderr
    assert "scaling: 4 run(s), 4 finished earlier; 0 step(s) to train" in final.stdout, final.stdout
    assert snapshot(out, RECORD_FILE) == records
    assert_whole(out)
    assert results(out) == results(reference_dir)  # the same as if never interrupted
    assert figures(out) == figures(reference_dir)
