"""`attnres bench` killed in the middle of writing its report: bench.json and bench.md are each the earlier
whole file or the new whole one, never a part, and a rerun writes a matching pair (tests/crash.py kills
the child process at a chosen write)."""

import json

from attnres.bench import format_markdown
from tests.crash import Kill, assert_whole, non_atomic_writes, run_cli


def test_a_killed_bench_leaves_whole_reports_and_reruns(tmp_path):
    out = tmp_path / "bench"
    json_path, md_path = out / "bench.json", out / "bench.md"

    def bench(kill=None):
        return run_cli(["bench", "--quick", "--variants", "block_attnres", "--depths", "none", "--out", str(out),
                        "--force"],  # each rerun replaces the earlier report, as asked
                       tmp_path, {}, kill)

    # uninterrupted: both files reach their final names by a rename
    reference = bench()
    assert reference.returncode == 0, reference.stderr
    assert non_atomic_writes(reference, tmp_path) == []
    earlier = {path: path.read_bytes() for path in (json_path, md_path)}

    # 1. killed halfway through writing bench.json again: both files are the earlier ones, whole
    first = bench(Kill("rename", str(json_path)))
    assert first.killed, first.stderr
    leftovers = assert_whole(out)
    assert {path: path.read_bytes() for path in earlier} == earlier
    assert [p.name.startswith(".bench.json.") for p in leftovers] == [True]  # the half, under its temporary name

    # 2. killed halfway through bench.md, after the new bench.json: each file whole, one new and one earlier
    second = bench(Kill("rename", str(md_path)))
    assert second.killed, second.stderr
    assert_whole(out)
    assert json_path.read_bytes() != earlier[json_path] and md_path.read_bytes() == earlier[md_path]

    # 3. the rerun writes both, and they describe the same run
    final = bench()
    assert final.returncode == 0, final.stderr
    assert_whole(out)
    assert md_path.read_text() == format_markdown(json.loads(json_path.read_text()))
    assert json_path.read_bytes() != earlier[json_path]  # timings at full precision: a new run
