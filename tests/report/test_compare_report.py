"""summarize and write_report on a synthetic results dict with hand-computed answers.

The interval itself (`ci95_halfwidth`) is tested in tests/analysis/test_intervals.py."""

import copy
import json
import math
import statistics

import pytest
import torch

from attnres import AttnResLM, ModelConfig
from attnres.analysis import collect_depth_stats
from attnres.report.compare_report import write_report
from attnres.report.compare_summary import summarize

ODD_NAME = "delta <block> (N=2)"  # must be escaped in HTML and Markdown


def full_stats(max_weight):
    names = [["e"] + [f"d{k}" for k in range(s)] for s in range(6)] + [["e"] + [f"d{k}" for k in range(6)]]
    return {"source_names": names, "mean_weights": [[1 / len(n)] * len(n) for n in names],
            "max_weight": max_weight, "hidden_rms": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0], "num_tokens": 10}


def model_stats(seed):
    torch.manual_seed(seed)
    model = AttnResLM(ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                  intermediate_size=32, residual="delta_block",
                                  residual_options={"num_blocks": 2}))
    with torch.no_grad():
        for router in model.routers:
            router.query.normal_()
    return collect_depth_stats(model, [torch.randint(0, 32, (2, 8))]).to_dict()


def run(seed, loss, step_time, stats, curve):
    return {"seed": seed, "val_curve": curve, "train_curve": [[s, v + 0.1] for s, v in curve],
            "final_val_loss": loss, "step_time_s": step_time, "tokens_per_s": 1000.0 / step_time, "tokens": 4096,
            "depth_stats": stats}


# The cost measurement after training: five rounds, every variant once per round (standard first).
STANDARD_STEPS = [0.10, 0.12, 0.11, 0.10, 0.13]
FULL_STEPS = [0.20, 0.25, 0.22, 0.21, 0.26]  # per round 2.0, 2.083, 2.0, 2.1, 2.0: a steady 2.0x
ODD_STEPS = [0.12, 0.30, 0.11, 0.10, 0.13]  # per round 1.2, 2.5, 1.0, 1.0, 1.0: the machine got busy


def cost_entry(steps, memory):
    return {"model": {}, "parameters": 100, "train_step_s": {"median_s": statistics.median(steps), "samples_s": steps},
            "memory": memory}


def make_cost():
    return {"settings": {"repeats": 5, "warmup": 2, "noise_threshold": 0.25, "seed": 0, "batch_size": 8,
                         "seq_len": 64, "precision": "fp32", "routing_impl": "auto", "routing": "lean",
                         "device": "cpu"},
            "created": "2026-11-30T12:05:00+00:00",
            "machine": {"device": "cpu", "device_name": "Test CPU 9000", "torch": "2.13.0", "threads": 2,
                        "cpu_capability": "AVX2", "cpu_native_bf16": False, "cpu_allocator": "jemalloc"},
            "variants": {"standard": cost_entry(STANDARD_STEPS, {"peak_bytes": 1100, "activation_bytes": 600}),
                         "full_attnres": cost_entry(FULL_STEPS, {"peak_bytes": 1500, "activation_bytes": 1200}),
                         ODD_NAME: cost_entry(ODD_STEPS, {"activation_bytes": 650})}}


def make_results():
    standard_stats = {"source_names": [], "mean_weights": [], "max_weight": [], "hidden_rms": [1.0] * 7,
                      "num_tokens": 10}
    return {
        "preset": "smoke", "command": "attnres compare --preset smoke", "created": "2026-11-30T12:00:00+00:00",
        "machine": {"device": "cpu", "torch": "2.13.0", "threads": 2},
        "settings": {"model": {"hidden_size": 32, "num_layers": 3}, "data": {"source": "demo"},
                     "train": {"steps": 20, "lr": 0.003}},
        "seeds": [0, 1],
        "variants": [
            {"name": "standard", "residual": "standard", "num_blocks": None, "runs": [
                run(0, 3.0, 0.10, standard_stats, [[0, 4.0], [10, 3.5], [20, 3.0]]),
                run(1, 3.2, 0.14, standard_stats, [[0, 4.2], [10, 3.7], [20, 3.2]])]},
            {"name": "full_attnres", "residual": "full_attnres", "num_blocks": None, "runs": [
                run(0, 2.9, 0.2, full_stats([None, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
                    [[0, 4.0], [10, 3.4], [20, 2.9]]),
                run(1, 2.95, 0.3, full_stats([None, 0.4, 0.4, 0.4, 0.4, 0.6, 0.8]),
                    [[0, 4.1], [10, 3.5], [20, 2.95], [30, 2.9]])]},
            {"name": ODD_NAME, "residual": "delta_block", "num_blocks": 2, "runs": [
                run(0, 3.05, 0.12, model_stats(0), [[0, 4.0], [20, 3.05]]),
                run(1, 3.15, 0.16, model_stats(1), [[0, 4.1], [20, 3.15]])]},
        ],
        "cost": make_cost(),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    results = make_results()
    out = tmp_path_factory.mktemp("report")
    written = write_report(copy.deepcopy(results), out)
    return results, out, written


def test_summary_numbers_equal_hand_computed_values():
    summary = summarize(make_results())
    assert list(summary) == ["standard", "full_attnres", ODD_NAME]
    std, full, odd = summary["standard"], summary["full_attnres"], summary[ODD_NAME]
    assert std["val_loss_mean"] == pytest.approx(3.1)
    assert std["val_loss_std"] == pytest.approx(0.2 / math.sqrt(2))  # sample std of two values
    assert std["ppl_mean"] == pytest.approx((math.exp(3.0) + math.exp(3.2)) / 2)
    assert std["ppl_std"] == pytest.approx(abs(math.exp(3.2) - math.exp(3.0)) / math.sqrt(2))
    assert std["delta_vs_standard"] == 0.0 and std["step_time_ratio"] == pytest.approx(1.0)
    assert std["max_weight_deep"] is None and std["max_weight_by_depth"] == []
    assert full["val_loss_mean"] == pytest.approx(2.925)
    assert full["delta_vs_standard"] == pytest.approx(2.925 - 3.1)
    # cost: the median of per-round ratios, their range, memory ratios; from the measurement, not the runs
    assert full["step_time_ratio"] == pytest.approx(2.0) and full["step_time_s"] == pytest.approx(0.22)
    assert (full["step_time_low"], full["step_time_high"]) == pytest.approx((2.0, 2.1))
    assert full["step_time_spread"] == pytest.approx(0.05) and full["step_time_noisy"] is False
    assert full["peak_memory_ratio"] == pytest.approx(1500 / 1100)
    assert full["activation_ratio"] == pytest.approx(1200 / 600)
    # Deepest third of six multi-source routers = the last two: (0.9+1.0)/2 and (0.6+0.8)/2.
    assert full["max_weight_deep"] == pytest.approx((0.95 + 0.7) / 2)
    assert full["max_weight_by_depth"] == pytest.approx([None, 0.45, 0.5, 0.55, 0.6, 0.75, 0.9])
    assert full["hidden_rms_by_depth"] == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    assert odd["peak_memory_ratio"] is None and odd["activation_ratio"] == pytest.approx(650 / 600)
    assert odd["step_time_ratio"] == pytest.approx(1.0)  # rounds 1.2, 2.5, 1.0, 1.0, 1.0
    assert (odd["step_time_low"], odd["step_time_high"]) == pytest.approx((1.0, 2.5))
    assert odd["step_time_noisy"] is True  # (2.5 - 1.0) / 1.0 = 1.5 > 0.25
    assert std["step_time_noisy"] is False and std["step_time_spread"] == 0.0
    assert 0 < odd["max_weight_deep"] <= 1


def test_curves_are_averaged_per_step_over_seeds():
    summary = summarize(make_results())
    curve = summary["full_attnres"]["val_curve"]
    assert [p[0] for p in curve] == [0, 10, 20, 30]
    assert curve[1] == pytest.approx([10, 3.45, statistics.stdev([3.4, 3.5])])
    assert curve[3] == [30, 2.9, 0.0]  # one seed has step 30
    assert summary["standard"]["train_curve"][0] == pytest.approx([0, 4.2, statistics.stdev([4.1, 4.3])])


def test_single_seed_has_zero_std():
    results = make_results()
    for variant in results["variants"]:
        variant["runs"] = variant["runs"][:1]
    summary = summarize(results)
    assert summary["standard"]["val_loss_std"] == 0.0 and summary["standard"]["ppl_std"] == 0.0
    assert summary["full_attnres"]["step_time_ratio"] == pytest.approx(2.0)  # cost does not depend on seeds


def test_a_diverged_run_gives_nan_not_an_error():
    results = make_results()
    results["variants"][1]["runs"][0]["final_val_loss"] = float("nan")
    results["variants"][1]["runs"][1]["final_val_loss"] = 1e6
    full = summarize(results)["full_attnres"]
    assert math.isnan(full["val_loss_mean"]) and math.isnan(full["val_loss_std"])
    assert math.isnan(full["ppl_std"]) and full["step_time_ratio"] == pytest.approx(2.0)


def test_every_file_is_written(report):
    _, out, written = report
    expected = {"results.json", "report.md", "index.html", "figures/val_loss.png", "figures/cost.png",
                "figures/max_weight_by_depth.png", "figures/hidden_rms_by_depth.png",
                "figures/routing_full_attnres.png", "figures/routing_delta-block-n-2.png"}
    assert {p.relative_to(out).as_posix() for p in written} == expected
    for path in written:
        assert path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temp files


def test_results_json_holds_input_summary_and_figures(report):
    results, out, _ = report
    saved = json.loads((out / "results.json").read_text())
    assert saved["variants"][1]["runs"][0]["final_val_loss"] == 2.9
    assert saved["command"] == results["command"]
    assert saved["summary"]["full_attnres"]["val_loss_mean"] == pytest.approx(2.925)
    assert saved["summary"]["full_attnres"]["step_time_ratio"] == pytest.approx(2.0)
    assert saved["summary"][ODD_NAME]["peak_memory_ratio"] is None
    assert saved["cost"]["variants"]["full_attnres"]["train_step_s"]["samples_s"] == FULL_STEPS
    assert sorted(saved["figures"]) == sorted(p for p in saved["figures"] if (out / p).is_file())
    assert len(saved["figures"]) == 6
    # Re-summarizing the saved file gives the saved summary: the report can be rebuilt from it.
    assert summarize(saved) == saved["summary"]


def table_row(markdown, name):
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_markdown_table_rows_match_the_summary(report):
    _, out, _ = report
    md = (out / "report.md").read_text()
    assert "attnres compare --preset smoke" in md and "hidden_size=32" in md and "device cpu" in md
    s = 0.2 / math.sqrt(2)
    e3, e32 = math.exp(3.0), math.exp(3.2)
    assert table_row(md, "standard") == [
        "standard", f"3.100 ± {s:.3f}", f"{(e3 + e32) / 2:.2f} ± {abs(e32 - e3) / math.sqrt(2):.2f}",
        # two seeds: t_{0.975, 1} = 12.706, standard error = |e32 - e3| / 2
        f"[{(e3 + e32) / 2 - 12.706 * abs(e32 - e3) / 2:.2f}, {(e3 + e32) / 2 + 12.706 * abs(e32 - e3) / 2:.2f}]",
        "baseline",
        "1.00×", "1.00×", "-"]
    f29, f295 = math.exp(2.9), math.exp(2.95)
    assert table_row(md, "full_attnres") == [
        "full_attnres", f"2.925 ± {0.05 / math.sqrt(2):.3f}",
        f"{(f29 + f295) / 2:.2f} ± {abs(f295 - f29) / math.sqrt(2):.2f}",
        f"[{(f29 + f295) / 2 - 12.706 * abs(f295 - f29) / 2:.2f}, {(f29 + f295) / 2 + 12.706 * abs(f295 - f29) / 2:.2f}]",
        "-0.175", "2.00× (2.00–2.10)",
        f"{1500 / 1100:.2f}×", "0.825"]
    odd = table_row(md, "delta &lt;block&gt; (N=2)")
    assert odd[4] == "+0.000" and odd[6] == "-"  # 3.1 - 3.1; its peak memory was not measured
    assert odd[5] == "noisy (1.00–2.50×)"  # not a bare number: the rounds disagree
    for fig in json.loads((out / "results.json").read_text())["figures"]:
        assert f"]({fig})" in md


def cost_section(markdown):
    return markdown.split("## Cost", 1)[1].split("## Runs", 1)[0]


def test_cost_section_states_method_machine_and_noise(report):
    _, out, _ = report
    section = cost_section((out / "report.md").read_text())
    for fact in ("5 rounds after 2 warm-up", "Routing lean (routing_impl=auto), precision fp32",
                 "Test CPU 9000 (ATen CPU kernels AVX2, native bf16: no, allocator: jemalloc), 2 torch threads",
                 "wider than 25%",
                 "8 x 64 token batch", "Too noisy to quote here: delta &lt;block&gt; (N=2)"):
        assert fact in section, fact
    assert table_row(section, "standard") == ["standard", "110.0", "baseline", "-", f"{1100 / 2**20:.1f}", "1.00×",
                                              f"{600 / 2**20:.1f}", "1.00×"]
    assert table_row(section, "full_attnres")[1:4] == ["220.0", "2.00×", "2.00–2.10×"]
    assert table_row(section, "delta &lt;block&gt; (N=2)")[2:4] == ["noisy", "1.00–2.50×"]


def test_cost_figure_says_noisy_instead_of_a_number(tmp_path, captured_figures):
    write_report(make_results(), tmp_path)
    fig = captured_figures["cost.png"]
    step = fig.axes[0]
    assert step.get_title() == "training step" and [ax.get_title() for ax in fig.axes[1:]] == ["peak memory",
                                                                                                "activations"]
    labels = [" ".join(t.get_text().split()) for t in step.texts]
    assert labels == ["2.00×", "noisy: 1.00–2.50×"]  # standard is the baseline, not a bar
    assert [t.get_text().strip() for t in fig.axes[1].texts] == [f"{1500 / 1100:.2f}×", "n/a"]
    caption = (tmp_path / "report.md").read_text().split("figures/cost.png)", 1)[1].split("\n\n", 2)[1]
    assert "labelled noisy (delta &lt;block&gt; (N=2))" in caption  # the caption names what is drawn


def test_cost_caption_mentions_no_hatched_bar_when_none_is_drawn(tmp_path):
    results = make_results()
    for variant in results["cost"]["variants"].values():  # every variant as steady as standard
        variant["train_step_s"]["samples_s"] = list(results["cost"]["variants"]["standard"]["train_step_s"]["samples_s"])
    write_report(results, tmp_path)
    caption = (tmp_path / "report.md").read_text().split("figures/cost.png)", 1)[1].split("\n\n", 2)[1]
    assert caption.startswith("*Training step") and "noisy" not in caption and "hatched" not in caption


def test_results_without_a_cost_measurement_say_so(tmp_path):
    results = make_results()
    del results["cost"]
    written = write_report(results, tmp_path)
    assert not (tmp_path / "figures" / "cost.png").exists() and tmp_path / "figures" / "cost.png" not in written
    assert "hold no cost measurement" in cost_section((tmp_path / "report.md").read_text())
    assert table_row((tmp_path / "report.md").read_text(), "full_attnres")[5] == "-"
    results_text = (tmp_path / "report.md").read_text().split("## Results", 1)[1].split("## Cost", 1)[0]
    assert "come from the cost measurement" not in results_text and "'-': these results hold no cost" in results_text


def test_captions_describe_what_is_drawn(tmp_path):
    results = make_results()
    for variant in results["variants"]:
        variant["runs"] = variant["runs"][:1]
    results["seeds"] = [0]
    write_report(results, tmp_path / "one")
    md = (tmp_path / "one" / "report.md").read_text()
    loss_caption = md.split("](figures/val_loss.png)", 1)[1].split("\n\n")[1]
    assert "shaded band" not in loss_caption and "one seed" in loss_caption  # one seed draws no band
    heat_caption = md.split("](figures/routing_full_attnres.png)", 1)[1].split("\n\n")[1]
    assert "d0…d5 = sub-layer outputs" in heat_caption and "partial" not in heat_caption
    two_seeds = tmp_path / "two"
    write_report(make_results(), two_seeds)
    assert "the shaded band is ± one standard deviation" in (two_seeds / "report.md").read_text()


def test_html_references_figures_and_escapes_names(report):
    _, out, _ = report
    page = (out / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    # laid out for a phone: the device's width, and tables scroll inside their own box
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    # settings, results, cost, runs, training stability
    assert page.count("<table") == page.count('<div class="table-scroll"><table') == 5
    for fig in json.loads((out / "results.json").read_text())["figures"]:
        assert f'src="{fig}"' in page
    assert "delta &lt;block&gt; (N=2)" in page and "<block>" not in page
    assert "2.925 ± " in page and "baseline" in page


def test_missing_run_key_names_key_and_variant():
    results = make_results()
    del results["variants"][1]["runs"][1]["final_val_loss"]
    with pytest.raises(ValueError, match=r"'full_attnres'.*'final_val_loss'"):
        summarize(results)
    results = make_results()
    del results["variants"][2]["runs"][0]["depth_stats"]
    with pytest.raises(ValueError, match=r"delta <block> \(N=2\).*'depth_stats'"):
        summarize(results)


def test_missing_standard_or_variant_key_is_an_error(tmp_path):
    results = make_results()
    del results["variants"][0]
    with pytest.raises(ValueError, match="standard"):
        write_report(results, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # validated before anything is written
    results = make_results()
    del results["variants"][1]["runs"]
    with pytest.raises(ValueError, match=r"'full_attnres' lacks required key 'runs'"):
        summarize(results)


def stability_section(markdown):
    return markdown.split("## Training stability", 1)[1].split("## Figures", 1)[0]


def with_stability(results):
    """make_results() with event totals on every run but the second seed of ODD_NAME (an older record)."""
    totals = {"standard": [(1, 0, 0.5), (2, 0, 1.0)], "full_attnres": [(0, 3, 0.25), (0, 1, 0.0)],
              ODD_NAME: [(4, 2, 0.1), None]}
    for variant in results["variants"]:
        for run, values in zip(variant["runs"], totals[variant["name"]]):
            if values is not None:
                loss, grad, rate = values
                run["stability"] = {"loss_spikes": loss, "grad_spikes": grad, "clipped_steps": round(rate * 20),
                                    "clip_rate": rate, "steps": 20}
    return results


def test_stability_table_shows_the_mean_and_each_seed(tmp_path):
    results = with_stability(make_results())
    summary = summarize(results)
    assert summary["standard"]["loss_spikes_by_seed"] == [1, 2] and summary["standard"]["loss_spikes_mean"] == 1.5
    assert summary["full_attnres"]["grad_spikes_mean"] == 2.0 and summary["full_attnres"]["clip_rate_mean"] == 0.125
    assert summary[ODD_NAME]["clip_rate_by_seed"] == [0.1, None]  # the mean is over the seeds that have it
    assert summary[ODD_NAME]["loss_spikes_mean"] == 4.0
    write_report(copy.deepcopy(results), tmp_path)
    section = stability_section((tmp_path / "report.md").read_text())
    assert "previous 20 steps" in section and "max(6.0 × their median absolute deviation, 0.1 nats)" in section
    assert "3.0 × the previous 20 steps' median" in section and "train.grad_clip=1.0" in section
    assert table_row(section, "standard") == ["standard", "1.5 (1, 2)", "0.0 (0, 0)", "75.0% (50.0%, 100.0%)"]
    assert table_row(section, "full_attnres") == ["full_attnres", "0.0 (0, 0)", "2.0 (3, 1)", "12.5% (25.0%, 0.0%)"]
    assert table_row(section, "delta &lt;block&gt; (N=2)")[1:] == ["4.0 (4, n/a)", "2.0 (2, n/a)", "10.0% (10.0%, n/a)"]
    page = (tmp_path / "index.html").read_text()
    assert "Training stability" in page and "75.0% (50.0%, 100.0%)" in page and "2.0 (3, 1)" in page
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"]["standard"]["clip_rate_by_seed"] == [0.5, 1.0]
    assert saved["variants"][0]["runs"][1]["stability"]["loss_spikes"] == 2
    assert summarize(saved) == saved["summary"]


def test_stability_table_of_records_without_events_says_not_available(report):
    _, out, _ = report  # make_results() has no "stability" in any run: records of an older version
    section = stability_section((out / "report.md").read_text())
    for name in ("standard", "full_attnres", "delta &lt;block&gt; (N=2)"):
        assert table_row(section, name)[1:] == ["n/a", "n/a", "n/a"]
    saved = json.loads((out / "results.json").read_text())["summary"]["standard"]
    assert saved["loss_spikes_mean"] is None and saved["clip_rate_by_seed"] == [None, None]


def test_stability_text_follows_the_presets_settings(tmp_path):
    results = with_stability(make_results())
    results["settings"]["train"].update(stability_window=8, grad_clip=None, grad_spike_ratio=5)
    for variant in results["variants"]:
        variant["runs"] = variant["runs"][:1]  # one seed: the value alone
    write_report(results, tmp_path)
    section = stability_section((tmp_path / "report.md").read_text())
    assert "previous 8 steps" in section and "5 × the previous 8 steps' median" in section
    assert "train.grad_clip is null" in section and "from step 9 on" in section
    assert table_row(section, "standard") == ["standard", "1", "0", "50.0%"]


def test_expert_balance_section_shows_the_largest_imbalance_per_seed_and_by_layer(tmp_path):
    results = make_results()
    # two MoE layers of 4 experts; seed 0: imbalances 1.2 and 2.0, seed 1: 1.0 and 1.6
    loads = [[[0.3, 0.25, 0.25, 0.2], [0.5, 0.2, 0.2, 0.1]], [[0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1]]]
    for variant in results["variants"][:2]:
        for run, load in zip(variant["runs"], loads, strict=True):
            run["expert_load"] = load
    summary = summarize(results)
    assert summary["standard"]["expert_imbalance_by_seed"] == pytest.approx([2.0, 1.6])
    assert summary["standard"]["expert_imbalance_mean"] == pytest.approx(1.8)
    assert summary["standard"]["expert_imbalance_by_layer"] == pytest.approx([1.1, 1.8])
    assert summary[ODD_NAME]["expert_imbalance_mean"] is None  # a dense variant
    write_report(copy.deepcopy(results), tmp_path)
    section = (tmp_path / "report.md").read_text().split("## Expert balance", 1)[1].split("## Figures", 1)[0]
    assert table_row(section, "standard") == ["standard", "1.80 (2.00, 1.60)", "1.10, 1.80"]
    assert "| delta" not in section


def test_a_comparison_without_experts_has_no_expert_section(report):
    _, out, _ = report
    assert "Expert balance" not in (out / "report.md").read_text()
