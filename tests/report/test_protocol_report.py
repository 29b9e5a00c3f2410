"""The protocol's report: paired differences by seed, ties with the best stated, the search table."""

import math

import pytest

from attnres.report import protocol_report
from attnres.report.protocol_report import search_rows, summarize_protocol, ties_sentence


def variant(name, residual, losses, chosen=3e-3, grid=None, edge=None, extended=()):
    runs = [{"seed": s, "final_test_loss": x, "final_val_loss": x + 0.01, "lr": chosen} for s, x in enumerate(losses)]
    return {"name": name, "residual": residual, "chosen_lr": chosen, "edge": edge, "extended": list(extended),
            "grid": grid or [{"lr": chosen, "mean_val_loss": 4.0, "val_losses": [4.0]}], "runs": runs}


RESULTS = {"variants": [
    variant("standard", "standard", [5.00, 5.10, 4.90, 5.05]),
    variant("block", "block_attnres", [4.80, 4.91, 4.70, 4.84]),           # 0.2 better on every seed
    variant("full", "full_attnres", [4.82, 4.88, 4.73, 4.86]),             # within noise of block
    variant("hc", "hyper_connections", [5.30, 5.20, 5.40, 5.35], chosen=1.2e-2, edge="high",
            grid=[{"lr": 6e-3, "mean_val_loss": math.inf, "val_losses": [math.nan]},
                  {"lr": 1.2e-2, "mean_val_loss": 5.3, "val_losses": [5.3]}], extended=[1.2e-2])]}


def test_differences_are_paired_by_seed_and_ties_with_the_best_are_stated():
    summary = summarize_protocol(RESULTS)
    assert summary["block"]["best"] and summary["block"]["tied"]
    assert summary["block"]["delta_vs_standard"] == pytest.approx(-0.2)
    assert summary["block"]["delta_vs_standard_ci95"] < 0.05  # paired: the seeds' shared offset cancels
    assert summary["full"]["tied"] is True and summary["hc"]["tied"] is False and summary["standard"]["tied"] is False
    assert ties_sentence(summary) == ("block has the lowest test loss; full is not distinguishable from it "
                                      "(the 95 % interval of the paired difference includes 0).")


def test_one_seed_has_no_interval_and_no_tie_verdict():
    one = {"variants": [variant("standard", "standard", [5.0]), variant("block", "block_attnres", [4.9])]}
    summary = summarize_protocol(one)
    assert summary["standard"]["tied"] is None and summary["block"]["delta_vs_standard_ci95"] is None


def test_the_search_table_marks_the_choice_a_diverged_rate_and_the_edge():
    header, rows = search_rows(RESULTS)
    assert header == ["variant", "0.003", "0.006", "0.012", "chosen", "note"]
    hc = rows[-1]
    assert hc[1:4] == ["-", "diverged", "**5.300**"]
    assert "searched beyond the grid at 0.012" in hc[-1] and "high edge" in hc[-1]


def test_results_without_a_test_loss_or_a_baseline_are_refused():
    broken = {"variants": [variant("standard", "standard", [5.0])]}
    del broken["variants"][0]["runs"][0]["final_test_loss"]
    with pytest.raises(ValueError, match="no final_test_loss"):
        summarize_protocol(broken)
    with pytest.raises(ValueError, match="exactly one 'standard'"):
        summarize_protocol({"variants": [variant("block", "block_attnres", [4.9])]})


def test_the_chosen_rate_is_bold_in_the_html_report_too():
    from attnres.report.document import render_html

    header, rows = search_rows(RESULTS)
    page = render_html([("table", header, rows, True)])
    assert "<td><strong>5.300</strong></td>" in page and "**" not in page


def test_a_study_states_its_tokens_per_parameter_over_its_variants():
    # the main setting's shape: 1,840 steps of 8 x 128 tokens; standard and hyper-connections' parameter counts
    results = {"tokens": {"per_run": 1_884_160, "train_split": 3_050_000},
               "variants": [{"parameters": 920_128, "runs": []}, {"parameters": 935_296, "runs": []}]}
    text = protocol_report.reading_text(results)
    assert "(0.62 times). That is 2.01 to 2.05 tokens per parameter over the variants, every parameter counted." in text
