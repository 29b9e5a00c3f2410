"""Progress of a whole comparison: a bar from the first moment on a terminal, bounded lines elsewhere."""

import io

from attnres.compare.progress import CompareProgress
from attnres.compare.run_comparison import run_compare
from tests.compare.test_compare_resume import preset  # noqa: F401  (a fixture)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_without_a_terminal_a_few_lines_per_run_with_an_eta():
    lines, clock = [], FakeClock()
    progress = CompareProgress(total_runs=3, done_runs=1, steps=80, log=lines.append, interactive=False, clock=clock)
    assert lines == ["compare: 3 run(s), 1 finished earlier; 80 step(s) to train"]  # before anything trains
    for label in ("standard seed 0", "full_attnres seed 0"):
        progress.start_run(label, 40)
        for step in range(1, 41):
            clock.now += 0.5
            progress.step({"step": step})
        progress.finish_run(f"{label}: val loss 5.0")
    progress.close()
    assert len(lines) == 1 + 2 * 5  # per run: start, 3 quarter marks, end; not a line per step
    assert lines[1] == "[2/3] standard seed 0: training 40 steps"
    assert lines[2] == "[2/3] standard seed 0: step 10/40, 0:05 elapsed, ETA 0:35"  # 70 steps left at 0.5 s
    assert lines[5] == "[2/3] standard seed 0: val loss 5.0"
    assert lines[6] == "[3/3] full_attnres seed 0: training 40 steps, 0:20 elapsed, ETA 0:20"
    assert lines[-1] == "[3/3] full_attnres seed 0: val loss 5.0"


def test_a_resumed_run_leaves_its_earlier_steps_out_of_the_total():
    lines, clock = [], FakeClock()
    progress = CompareProgress(total_runs=1, done_runs=0, steps=40, log=lines.append, interactive=False, clock=clock)
    progress.start_run("standard seed 0", 40, "resuming")
    for step in range(21, 41):  # the checkpoint was at step 20
        clock.now += 1.0
        progress.step({"step": step})
    assert progress.total_steps == 20 and progress.steps_done == 20
    # at step 30: 10 steps in 10 s, 10 to go
    assert lines[1:] == ["[1/1] standard seed 0: resuming 40 steps",
                         "[1/1] standard seed 0: step 30/40, 0:10 elapsed, ETA 0:10"]


def test_on_a_terminal_one_bar_is_drawn_from_the_start():
    terminal, lines = FakeTerminal(), []
    progress = CompareProgress(total_runs=2, done_runs=0, steps=20, log=lines.append, stream=terminal)
    assert progress.interactive and "compare 0/2 runs" in terminal.getvalue()  # visible before the first run
    progress.start_run("block_attnres (N=4) seed 0", 10)
    for step in range(1, 11):
        progress.step({"step": step})
    progress.finish_run("block_attnres (N=4) seed 0: val loss 5.0")
    progress.phase("measuring cost (every variant interleaved)")
    shown = terminal.getvalue()
    progress.close()
    assert "block_attnres (N=4) seed 0: step 10/10" in shown and "10/20" in shown
    assert "compare 1/2 runs" in shown and "measuring cost" in shown
    assert lines == ["[1/2] block_attnres (N=4) seed 0: val loss 5.0"]  # log lines still reach the log


def test_a_comparison_reports_progress_before_its_first_run_and_per_run(preset, tmp_path):  # noqa: F811
    lines = []
    run_compare(preset, tmp_path / "cmp", seeds=1, log=lines.append, progress=False)
    assert lines[0] == "compare: 2 run(s), 0 finished earlier; 8 step(s) to train"
    assert lines[1] == "[1/2] standard seed 0: training 4 steps"
    assert any(line.startswith("[2/2] block_attnres (N=2) [q~N(0,0.02)] seed 0: val loss") for line in lines)
    assert "compare: measuring cost (every variant interleaved)" in lines and lines[-1] == "compare: writing the report"
    assert len(lines) < 30  # 4 steps per run: a line per quarter at most
