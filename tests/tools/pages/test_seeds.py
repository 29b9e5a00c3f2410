"""tools.pages.seeds: differences paired by seed, intervals as table cells, the deepest routers."""

import math

import pytest

from tools.pages.seeds import deep_routing, excludes_zero, paired_difference, signed_interval
from tests.report.test_compare_report import make_results


def test_differences_are_paired_by_seed():
    results = make_results()
    standard, full = results["variants"][0], results["variants"][1]
    assert paired_difference(full, standard) == pytest.approx([-0.1, -0.25])
    full["runs"] = full["runs"][1:]  # a seed missing on one side is left out, not mismatched
    assert paired_difference(full, standard) == pytest.approx([-0.25])


def test_an_interval_cell_is_the_student_t_half_width():
    # mean of -0.1 and -0.25 with t(0.975, 1) = 12.706 times the standard error 0.075
    assert signed_interval([-0.1, -0.25]) == f"-0.175 ± {12.706 * 0.075:.3f}"
    assert signed_interval([-0.1]) == "-0.100"  # one seed: no interval
    assert not excludes_zero([-0.1, -0.25]) and excludes_zero([-0.1, -0.11, -0.12]) and not excludes_zero([-0.1])


def test_deep_routing_uses_the_deepest_third_of_multi_source_routers():
    run = make_results()["variants"][1]["runs"][0]  # max weights None, 0.5 .. 1.0 over 7 routers
    deep = deep_routing(run)
    # 6 multi-source routers -> the last 2 (6 and 7 sources, uniform weights in the fixture)
    assert deep["max_weight"] == pytest.approx((0.9 + 1.0) / 2)
    assert deep["uniform"] == pytest.approx((1 / 6 + 1 / 7) / 2)
    assert deep["embedding_weight"] == pytest.approx((1 / 6 + 1 / 7) / 2)
    assert math.isnan(deep["effective_sources"])  # the fixture predates effective sources
