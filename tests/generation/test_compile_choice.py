"""Compile the decode step only where it pays (attnres.generation.compile_choice): the rule, the measured
compile times it reads, and a generation with compile="auto" taking either way with a stubbed cost
model. No test reads a clock for its assertion."""

import pytest
import torch

from attnres.generation.compile_choice import (PRIOR_COMPILE_S_PER_SUBLAYER, PRIOR_SPEEDUP, PRIOR_WARM_SHARE,
                                          CompileEstimate, CompileTimes, compile_pays, saved_seconds)
from attnres.generation.fast_generator import FastGenerator
from tests.generation.test_fast_generator import eager_greedy, model_for, prompt


def test_the_rule_weighs_the_compile_against_what_it_saves():
    estimate = CompileEstimate(compile_s=60.0, speedup=2.0, measured=True)
    # a 0.1 s eager step halved saves 0.05 s a step: 1,200 steps repay 60 s
    assert not compile_pays(estimate, 0.1, 1_199) and compile_pays(estimate, 0.1, 1_201)
    assert saved_seconds(estimate, 0.1, 1_000) == pytest.approx(50.0)
    assert not compile_pays(CompileEstimate(0.5, 1.0, True), 10.0, 10**6)  # no speed-up, no compile


def test_compile_times_start_from_the_priors_and_learn_cold_then_warm(tmp_path):
    times = CompileTimes(tmp_path / "times.json")
    assert times.estimate("k", 8) == CompileEstimate(PRIOR_COMPILE_S_PER_SUBLAYER * 8, PRIOR_SPEEDUP, False)
    times.record("k", 100.0, 2.5)  # the first compile of a shape: cold; its code is now in inductor's cache
    assert times.estimate("k", 8) == CompileEstimate(PRIOR_WARM_SHARE * 100.0, 2.5, False)
    times.record("k", 6.0, 2.4)  # a start from the cache
    assert times.estimate("k", 8) == CompileEstimate(6.0, 2.4, True)
    times.record("k", 90.0, None)  # the cache was emptied: cold again
    assert times.read()["k"] == {"cold_s": 90.0, "speedup": 2.4}
    (tmp_path / "times.json").write_text("not json")
    assert times.estimate("k", 8).measured is False  # an unreadable record only loses the estimate


class FixedTimes(CompileTimes):
    """A stubbed cost model: every shape is expected to compile in `compile_s` at `speedup`."""

    def __init__(self, path, compile_s: float, speedup: float) -> None:
        super().__init__(path)
        self.fixed = CompileEstimate(compile_s, speedup, measured=True)

    def estimate(self, key, num_sublayers):
        return self.fixed


def test_auto_decodes_eagerly_where_a_compile_would_not_pay(tmp_path):
    model = model_for()
    lines = []
    generator = FastGenerator(model, compile="auto", backend="aot_eager", log=lines.append,
                              times=FixedTimes(tmp_path / "t.json", compile_s=1e6, speedup=2.0))
    result = generator.generate(prompt(), 12)
    assert result.sequences.tolist() == eager_greedy(model, prompt(), 12).tolist()
    assert result.compile_mode is None and result.compile_s == 0.0 and lines == []
    assert result.compile_choice.startswith("eager: compiling would take about 1000000 s (measured on this machine)")
    assert not (tmp_path / "t.json").exists()  # nothing compiled, nothing measured


@pytest.mark.compile
def test_auto_compiles_where_it_pays_says_so_first_and_records_the_compile(tmp_path):
    torch._dynamo.reset()
    model = model_for()
    lines = []
    times = FixedTimes(tmp_path / "t.json", compile_s=0.0, speedup=2.0)
    generator = FastGenerator(model, compile="auto", backend="aot_eager", log=lines.append, times=times)
    result = generator.generate(prompt(), 12)
    assert result.sequences.tolist() == eager_greedy(model, prompt(), 12).tolist()
    assert result.compile_mode == "default" and result.compile_s > 0 and result.decode_steps == 8  # 2 probe steps
    assert len(lines) == 1 and lines[0].startswith("compiling the decode step: about 0 s (measured on this machine)")
    assert result.compile_choice.startswith("compiled:")
    assert list(times.read().values())[0]["cold_s"] == result.compile_s  # measured for the next run's estimate
    again = generator.generate(prompt(seed=2), 12)  # compiled already: no second compile
    assert again.compile_s == 0.0 and again.sequences.tolist() == eager_greedy(model, prompt(seed=2), 12).tolist()
