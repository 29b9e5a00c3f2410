"""A report folder is replaced only by the command that wrote it, on the same inputs, or with --force (issue 59)."""

import json

import pytest

from attnres.cli import main
from attnres.common.errors import InputError
from attnres.report.folder import MANIFEST, check_report_folder, mark_report_folder


def test_a_missing_or_empty_folder_is_taken(tmp_path):
    check_report_folder(tmp_path / "new", "analyze", ["a"])
    check_report_folder(tmp_path, "analyze", ["a"])


def test_a_users_own_files_are_refused_naming_them_unless_forced(tmp_path):
    for name in ("summary.md", "index.html", "notes.txt"):
        (tmp_path / name).write_text("mine")
    with pytest.raises(InputError, match=r"--out .* holds files attnres analyze did not write \(index.html, "
                                         r"notes.txt, summary.md\); choose another --out .* pass --force"):
        check_report_folder(tmp_path, "analyze", ["a"])
    check_report_folder(tmp_path, "analyze", ["a"], force=True)


def test_a_log_the_shell_opened_before_the_command_ran_is_not_refused_nor_touched(tmp_path):
    # `attnres compare --out X > X/shard0.log`: the shell creates the log first; no command writes a .log
    (tmp_path / "shard0.log").write_text("compare: waiting")
    check_report_folder(tmp_path, "compare", "protocol_kjv")
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(InputError, match=r"did not write \(notes.md\)"):
        check_report_folder(tmp_path, "compare", "protocol_kjv")
    assert (tmp_path / "shard0.log").read_text() == "compare: waiting"


def test_the_same_command_on_the_same_inputs_may_rewrite_its_report(tmp_path):
    (tmp_path / "summary.md").write_text("a report")
    mark_report_folder(tmp_path, "analyze", ("ckpt/a", "ckpt/b"))
    check_report_folder(tmp_path, "analyze", ["ckpt/a", "ckpt/b"])  # a tuple reads back as a list


def test_another_commands_report_or_other_inputs_are_refused_unless_forced(tmp_path):
    (tmp_path / "summary.md").write_text("a report")
    mark_report_folder(tmp_path, "analyze", ["ckpt/a"])
    with pytest.raises(InputError, match=r"holds the report of attnres analyze on other inputs \(ckpt/a there, ckpt/b "
                                         r"now\)"):
        check_report_folder(tmp_path, "analyze", ["ckpt/b"])
    mark_report_folder(tmp_path, "analyze", {"checkpoints": ["a"], "max_batches": 4})
    with pytest.raises(InputError, match=r"on other inputs \(max_batches: 4 there, 2 now\)"):
        check_report_folder(tmp_path, "analyze", {"checkpoints": ["a"], "max_batches": 2})
    with pytest.raises(InputError, match=r"holds the report of attnres analyze; choose another --out, or pass --force"):
        check_report_folder(tmp_path, "bench")
    check_report_folder(tmp_path, "analyze", ["ckpt/b"], force=True)


def test_a_bench_report_holds_timings_a_rerun_would_not_reproduce_so_a_rerun_is_refused(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"config": {}, "models": []}))  # an earlier release's
    with pytest.raises(InputError, match=r"holds an earlier attnres bench report, whose measurements a rerun would "
                                         r"not reproduce; choose another --out, or pass --force"):
        check_report_folder(tmp_path, "bench", rerun=False)
    mark_report_folder(tmp_path, "bench")
    with pytest.raises(InputError, match="would not reproduce"):
        check_report_folder(tmp_path, "bench", rerun=False)
    check_report_folder(tmp_path, "bench", rerun=False, force=True)


@pytest.mark.parametrize("command, filename, results", [
    ("compare", "results.json", {"preset": "p", "variants": [], "summary": {}}),
    ("scaling", "results.json", {"preset": "p", "sizes": [], "fit": {}}),
    ("bench", "bench.json", {"config": {}, "models": []}),
    ("analyze", "analysis.json", {"settings": {}, "checkpoints": []}),
])
def test_a_report_written_before_manifests_is_recognised_by_its_results_file(tmp_path, command, filename, results):
    (tmp_path / filename).write_text(json.dumps(results))
    (tmp_path / "report.md").write_text("its report")
    check_report_folder(tmp_path, command, "p")
    (tmp_path / filename).write_text(json.dumps({"mine": 1}))  # a user's JSON of the same name is not
    with pytest.raises(InputError, match="did not write"):
        check_report_folder(tmp_path, command, "p")


def test_a_comparison_under_way_is_recognised_by_its_runs(tmp_path):
    (tmp_path / "runs" / "standard" / "seed0").mkdir(parents=True)
    check_report_folder(tmp_path, "compare", "p")
    with pytest.raises(InputError, match="did not write"):
        check_report_folder(tmp_path, "analyze", ["a"])


def test_analyze_and_compare_refuse_a_folder_of_the_users_files_before_any_work(tmp_path, capsys):
    (tmp_path / "summary.md").write_text("mine")
    assert main(["analyze", str(tmp_path / "no-checkpoint"), "--out", str(tmp_path)]) == 2
    assert main(["compare", "--preset", "default", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("did not write (summary.md)") == 2 and "Traceback" not in err
    assert (tmp_path / "summary.md").read_text() == "mine" and not (tmp_path / MANIFEST).exists()
