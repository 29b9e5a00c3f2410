"""The headline rule (docs/explanation/protocol.md): a variant is recommended over standard only when its
main contrast survives Holm's correction, every replication agrees in sign with a pooled interval below 0,
and standard trained for the same time does not reverse it."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from attnres.analysis.contrasts import paired_differences
from attnres.compare.headline import Evidence, comparison_headline, draw_headline

ROOT = Path(__file__).resolve().parents[2]
# zero mean over the first 8 and over all 16
NOISE = np.array([0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.01, -0.03, 0.02, -0.02, 0.01, 0.03, -0.01, 0.0, 0.0])


def diffs(mean: float, n: int = 16, scale: float = 1.0) -> list[float]:
    """n (8 or 16) paired differences with this mean and a fixed spread (SD about 0.02 x scale)."""
    return list(mean + scale * NOISE[:n])


def winning(**changes) -> Evidence:
    """Block AttnRes better everywhere, hyper-connections better in the main setting only."""
    values = {"main": {"block_attnres": diffs(-0.05), "hyper_connections": diffs(-0.08), "delta_block": diffs(0.01)},
              "replications": {"kjv": {"block_attnres": diffs(-0.04, 8), "hyper_connections": diffs(-0.06, 8),
                                       "delta_block": diffs(0.0, 8)},
                               "kimi_linear": {"block_attnres": diffs(-0.03, 8), "hyper_connections": diffs(0.3, 8),
                                               "delta_block": diffs(-0.01, 8)}},
              "equal_time": {"block_attnres": diffs(-0.02), "hyper_connections": diffs(-0.01)},
              "step_cost": {"block_attnres": 1.08, "hyper_connections": 1.44, "delta_block": 1.07}}
    return Evidence(**{**values, **changes})


def test_a_variant_that_passes_all_three_conditions_is_recommended():
    headline = draw_headline(winning())
    assert headline.recommended == ["block_attnres"]
    verdict = headline.verdicts["block_attnres"]
    assert verdict.survives and verdict.replicates and verdict.holds_at_equal_time and verdict.recommended
    assert verdict.pooled.k == 3 and verdict.pooled.ci_hk[1] < 0


def test_a_replication_of_the_other_sign_withholds_the_recommendation():
    headline = draw_headline(winning())
    hc = headline.verdicts["hyper_connections"]
    assert hc.survives and not hc.replicates and not hc.recommended
    assert hc.replication_means["kimi_linear"] > 0


def test_a_main_contrast_that_does_not_survive_holm_is_not_enough():
    # p about 0.03 alone, but three contrasts: Holm multiplies the smallest p by 3
    weak = diffs(-0.02, scale=1.5)
    evidence = winning(main={"block_attnres": weak, "hyper_connections": diffs(0.0), "delta_block": diffs(0.01)})
    headline = draw_headline(evidence)
    verdict = headline.verdicts["block_attnres"]
    assert verdict.main.p_two_sided < 0.05 < verdict.holm_p and not verdict.survives
    assert headline.recommended == []


def test_standard_trained_as_long_reverses_a_gain_or_a_missing_arm_withholds_it():
    reversed_arm = draw_headline(winning(equal_time={"block_attnres": diffs(0.01)}))
    assert reversed_arm.recommended == [] and not reversed_arm.verdicts["block_attnres"].holds_at_equal_time
    missing = draw_headline(winning(equal_time={}))
    assert missing.recommended == []


def test_a_pooled_interval_that_holds_zero_fails_even_when_every_sign_agrees():
    # the replications agree in sign but sit near 0, far from the main effect: the settings disagree
    noisy = {"kjv": {"block_attnres": diffs(-0.001, 8)}, "kimi_linear": {"block_attnres": diffs(-0.002, 8)}}
    evidence = winning(main={"block_attnres": diffs(-0.03)}, replications=noisy)
    verdict = draw_headline(evidence).verdicts["block_attnres"]
    assert verdict.survives and all(m < 0 for m in verdict.replication_means.values())
    assert verdict.pooled.ci_hk[1] > 0 and not verdict.replicates


def test_several_passing_variants_are_ordered_by_the_best_test_or_else_by_step_cost():
    everywhere = {"main": {"block_attnres": diffs(-0.05), "delta_block": diffs(-0.05)},
                  "replications": {"kjv": {"block_attnres": diffs(-0.05, 8), "delta_block": diffs(-0.05, 8)},
                                   "kimi_linear": {"block_attnres": diffs(-0.05, 8), "delta_block": diffs(-0.05, 8)}},
                  "equal_time": {"block_attnres": diffs(-0.02), "delta_block": diffs(-0.02)},
                  "step_cost": {"block_attnres": 1.08, "delta_block": 1.07}}
    tied = draw_headline(Evidence(**everywhere))
    assert tied.recommended == ["delta_block", "block_attnres"] and not tied.best_shown
    everywhere["main"]["block_attnres"] = diffs(-0.12)
    everywhere["replications"] = {s: {**d, "block_attnres": diffs(-0.12, 8)} for s, d in everywhere["replications"].items()}
    shown = draw_headline(Evidence(**everywhere))
    assert shown.recommended == ["block_attnres", "delta_block"] and shown.best_shown


def test_leads_name_the_lowest_mean_in_each_setting_and_standard_where_nothing_is_below_it():
    headline = draw_headline(winning(replications={"kjv": {"block_attnres": diffs(0.02, 8)}}))
    assert headline.leads == {"main": "hyper_connections", "kjv": "standard"}


def test_a_replication_not_yet_run_fails_the_second_condition_and_leads_nowhere():
    headline = draw_headline(winning(replications={**winning().replications, "kimi_linear": {}}))
    assert headline.recommended == []
    assert not headline.verdicts["block_attnres"].replicates and headline.verdicts["block_attnres"].survives
    assert "kimi_linear" not in headline.leads and headline.leads["kjv"] == "hyper_connections"


def committed(study: str) -> dict:
    return json.loads((ROOT / "results" / study / "results.json").read_text())


def test_the_committed_fair_fight_files_do_not_recommend_hyper_connections_unconditionally():
    primary = ("block_attnres", "hyper_connections", "delta_block")
    evidence = Evidence(main=paired_differences(committed("fair-dense"), primary),
                        replications={"python-docs": paired_differences(committed("fair-pydocs"), primary),
                                      "kimi_linear": paired_differences(committed("fair-kimi-linear"), primary)})
    headline = draw_headline(evidence)
    hc = headline.verdicts["hyper_connections"]
    assert "hyper_connections" not in headline.recommended and headline.recommended == []
    assert hc.replication_means["kimi_linear"] > 0 and not hc.replicates
    assert headline.verdicts["block_attnres"].holm_p > 0.05  # the 0.2 README's "better" does not survive Holm


def test_one_comparison_applies_the_rule_to_its_own_seeds_and_never_recommends():
    results = committed("fair-dense")  # 8 seeds, every variant: the main contrasts alone
    headline = comparison_headline(results)
    assert headline["seeds"] == 8 and headline["loss"] == "final_test_loss"
    assert headline["survives"] == ["hyper_connections"] and headline["recommended"] == []


def test_a_comparison_without_a_primary_contrast_has_no_headline():
    dense = committed("fair-dense")
    alone = {**dense, "variants": [v for v in dense["variants"] if v["residual"] == "standard"]}  # an equal-time arm
    secondary = {**dense, "variants": [v for v in dense["variants"] if v["residual"] in ("standard", "full_attnres")]}
    without_standard = {**dense, "variants": [v for v in dense["variants"] if v["residual"] != "standard"]}
    assert comparison_headline(alone) is None
    assert comparison_headline(secondary) is None
    assert comparison_headline(without_standard) is None
