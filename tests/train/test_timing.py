"""Interleaved timing on a fake clock: the round-robin order, warm-up exclusion, medians, units."""

import pytest

from attnres.train.timing import Task, median_interval, ratio, ratio_spread, round_ratios, run_interleaved


class FakeClock:
    """A clock that only moves when a fake task says it spent time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_task(name, durations, clock, calls, units=1, setup_cost=0.0):
    rounds = iter(durations)

    def run():
        calls.append(name)
        clock.now += next(rounds)

    def setup():
        calls.append(f"setup {name}")
        clock.now += setup_cost  # untimed: must not reach the samples

    return Task(name, run, setup=setup if setup_cost else None, units=units)


def test_round_robin_order_warmup_dropped_and_medians():
    clock, calls = FakeClock(), []
    tasks = [make_task("standard", [9.0, 1.0, 2.0, 3.0, 4.0, 100.0], clock, calls),
             make_task("full", [9.0, 5.0, 1.0, 3.0, 2.0, 4.0], clock, calls),
             make_task("block", [9.0, 2.0, 2.0, 2.0, 2.0, 2.0], clock, calls)]
    timings = run_interleaved(tasks, repeats=5, warmup=1, clock=clock)
    assert calls == ["standard", "full", "block"] * 6
    assert timings["standard"].samples == [1.0, 2.0, 3.0, 4.0, 100.0]
    assert timings["standard"].median == 3.0  # an outlier does not move the median
    assert timings["full"].median == 3.0
    assert timings["block"].median == 2.0
    assert timings["full"].to_dict() == {"median_s": 3.0, "samples_s": [5.0, 1.0, 3.0, 2.0, 4.0]}


def test_setup_is_untimed_and_units_divide():
    clock, calls = FakeClock(), []
    tasks = [make_task("train", [1.0] * 7, clock, calls),
             make_task("decode", [8.0, 8.0, 4.0, 8.0, 12.0, 16.0, 8.0], clock, calls, units=4, setup_cost=50.0)]
    timings = run_interleaved(tasks, repeats=5, warmup=2, clock=clock)
    assert calls == ["train", "setup decode", "decode"] * 7
    assert timings["decode"].samples == [1.0, 2.0, 3.0, 4.0, 2.0]
    assert timings["decode"].median == 2.0
    assert timings["train"].samples == [1.0] * 5


def test_sync_brackets_every_timed_run():
    clock, calls = FakeClock(), []
    tasks = [make_task("a", [1.0] * 2, clock, calls)]
    run_interleaved(tasks, repeats=1, warmup=1, clock=clock, sync=lambda: calls.append("sync"))
    assert calls == ["sync", "a", "sync"] * 2


def test_log_names_warmup_and_measured_rounds():
    clock, lines = FakeClock(), []
    run_interleaved([make_task("a", [1.0] * 3, clock, [])], repeats=2, warmup=1, clock=clock, log=lines.append,
                    label="x: ")
    assert lines == ["x: round 1/3 (warm-up)", "x: round 2/3 (measured)", "x: round 3/3 (measured)"]


def test_bad_arguments():
    clock = FakeClock()
    with pytest.raises(ValueError, match="repeats >= 1"):
        run_interleaved([make_task("a", [1.0], clock, [])], repeats=0, warmup=0, clock=clock)
    with pytest.raises(ValueError, match="unique"):
        run_interleaved([make_task("a", [1.0], clock, []), make_task("a", [1.0], clock, [])], repeats=1, warmup=0,
                        clock=clock)


def test_ratio():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, None) is None and ratio(1.0, 0.0) is None


def test_round_ratios_pair_samples_of_the_same_round():
    assert round_ratios([2.0, 3.0, 4.0], [1.0, 1.5, 0.0]) == [2.0, 2.0]  # a zero base is left out
    with pytest.raises(ValueError, match="same rounds"):
        round_ratios([1.0, 2.0], [1.0])


def test_median_interval_by_order_statistics():
    # 5 rounds: the whole range covers the median with 1 - 2/32; 10 rounds: the 2nd to the 9th value
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0, pytest.approx(0.9375))
    assert median_interval(list(range(10))) == (1, 8, pytest.approx(1 - 2 * 11 / 1024))
    assert median_interval(list(range(20)))[:2] == (5, 14)  # narrower with more rounds, unlike min-max


def test_ratio_spread_marks_wide_intervals_noisy():
    steady = ratio_spread([2.0, 2.1, 2.0, 1.95, 2.05], noise_threshold=0.25)
    assert steady["ratio"] == 2.0 and (steady["low"], steady["high"]) == (1.95, 2.1)
    assert steady["spread"] == pytest.approx(0.075) and steady["noisy"] is False
    busy = ratio_spread([1.2, 2.5, 1.0, 1.0, 1.0], noise_threshold=0.25)
    assert busy["ratio"] == 1.0 and busy["spread"] == pytest.approx(1.5) and busy["noisy"] is True
    assert ratio_spread([], noise_threshold=0.25)["ratio"] is None
