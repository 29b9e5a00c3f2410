"""The protocol's tests within one setting: differences paired by seed, a failed run counted against its
variant, Holm's correction within each family, "equivalent" only by TOST, the best-test, failure rates."""

import math

import pytest

from attnres.analysis.contrasts import failure_rates, paired_differences, setting_tests

BASE = [4.00, 4.10, 4.05, 3.95, 4.02, 4.08, 3.98, 4.04]
WOBBLE = [0.004, -0.004, 0.002, -0.002, 0.0, 0.003, -0.003, 0.0]


def results(gains: dict[str, float], threshold=6.0, wobble=1.0) -> dict:
    def runs(gain):
        return [{"seed": 1000 + i, "final_test_loss": b + gain + (w * wobble if gain else 0.0)}
                for i, (b, w) in enumerate(zip(BASE, WOBBLE))]
    return {"protocol": {"failure_threshold": threshold},
            "variants": [{"name": "standard", "residual": "standard", "runs": runs(0.0)}]
            + [{"name": r, "residual": r, "runs": runs(g)} for r, g in gains.items()]}


def test_differences_are_paired_by_seed_and_a_failed_run_counts_at_the_threshold():
    data = results({"hyper_connections": -0.2})
    data["variants"][1]["runs"][0]["final_test_loss"] = math.nan
    data["variants"][1]["runs"][1]["final_test_loss"] = 7.5  # above the threshold: failed too
    diffs = paired_differences(data)["hyper_connections"]
    assert diffs[0] == pytest.approx(6.0 - 4.00) and diffs[1] == pytest.approx(6.0 - 4.10)
    assert diffs[2] == pytest.approx(-0.2 + 0.002)
    assert failure_rates(data)["hyper_connections"]["failed"] == 2
    low, high = failure_rates(data)["hyper_connections"]["interval"]
    assert low == pytest.approx(0.0319, abs=1e-4) and high == pytest.approx(0.6509, abs=1e-4)  # Clopper-Pearson, 2 of 8


def test_each_family_is_corrected_on_its_own_and_the_verdicts_follow_the_tests():
    tests = setting_tests(results({"block_attnres": -0.05, "hyper_connections": 0.004, "delta_block": 0.0001,
                                   "mhc": 0.05}), primary=("block_attnres", "hyper_connections", "delta_block"))
    c = tests["contrasts"]
    assert {r: e["family"] for r, e in c.items()} == {"block_attnres": "primary", "hyper_connections": "primary",
                                                      "delta_block": "primary", "mhc": "secondary"}
    assert c["block_attnres"]["verdict"] == "better" and c["mhc"]["verdict"] == "worse"
    assert c["mhc"]["holm_p"] == pytest.approx(c["mhc"]["p"])  # a family of one
    assert c["delta_block"]["verdict"] == "equivalent" and c["delta_block"]["tost_p"] < 0.05
    assert c["block_attnres"]["holm_p"] >= c["block_attnres"]["p"]


def test_an_interval_that_holds_zero_is_not_equivalence():
    loose = setting_tests(results({"delta_block": 0.01}, wobble=20), primary=("delta_block",))
    entry = loose["contrasts"]["delta_block"]
    assert entry["ci"][0] < 0 < entry["ci"][1] and entry["verdict"] == "not shown different"


def test_the_best_is_claimed_only_when_it_beats_every_other_primary_variant():
    clear = setting_tests(results({"block_attnres": -0.10, "hyper_connections": -0.02}), primary=("block_attnres",
                                                                                               "hyper_connections"))
    assert clear["best"]["candidate"] == "block_attnres" and clear["best"]["shown_best"]
    close = setting_tests(results({"block_attnres": -0.0201, "hyper_connections": -0.02}, wobble=20),
                          primary=("block_attnres", "hyper_connections"))
    assert not close["best"]["shown_best"]
