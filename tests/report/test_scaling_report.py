"""write_scaling_report on synthetic sweeps drawn from known laws: every file, a conclusion computed
from results.json's numbers, refused and flagged fits said in words, and each variant's one style."""

import copy
import json
from html import escape
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.image import imread

from attnres.report.scaling_report import FLOOR, variant_styles, write_scaling_report
from attnres.report.style import style_of
from attnres.scaling.summary import summarize_sweep
from tests.report.test_plots import assert_legible
from tests.scaling.sweeps import COMPUTE, SEEDS, WIDTHS, ahead, below_floor, size_name, standard_loss, sweep, variant

BLOCK, FULL, TWO_SIZES, ZIGZAG = "block_attnres (N=8)", "full_attnres", "delta_attnres", "hyper_connections"
FIGURES = ("loss_vs_compute.png", "compute_advantage.png", "loss_vs_parameters.png")


def zigzag(compute):
    """Standard's law 3 % up and down at alternate sizes: no smooth law fits it within the seed noise."""
    return standard_loss(compute) * (1 + 0.03 * np.cos(np.pi * np.log10(np.asarray(compute) / COMPUTE[0]) / 0.8))


def make_variants() -> list[dict]:
    variants = sweep(seed=5) + [variant(ZIGZAG, "hyper_connections", zigzag, np.random.default_rng(7))]
    for v in variants[:2]:  # divergence counters recorded by standard and block only
        for run in v["runs"]:
            run["stability"] = {"loss_spikes": 1, "grad_spikes": 2, "clipped_steps": 3, "clip_rate": 0.1, "steps": 30}
    return variants


def make_results(variants=None, replicates: int = 60) -> dict:
    variants = make_variants() if variants is None else variants
    sizes = [{"name": size_name(i), "hidden_size": w, "num_layers": 4 + i, "num_heads": w // 16,
              "num_kv_heads": w // 32, "intermediate_size": 3 * w, "parameters": 12 * w * w * (4 + i),
              "total_parameters": 12 * w * w * (4 + i) + 2048 * w, "tokens": 240 * w * w * (4 + i),
              "epochs": 240 * w * w * (4 + i) / 1_000_000, "steps": 100 * (i + 1), "seeds": list(SEEDS)} for i, w in enumerate(WIDTHS)]
    return {"preset": "synthetic", "description": "Six sizes drawn from known laws.",
            "command": "attnres scaling --preset synthetic", "created": "2026-12-03T10:00:00+00:00",
            "machine": {"device": "cpu", "device_name": "Test CPU 9000", "torch": "2.13.0", "threads": 2},
            "rules": {"tokens": "20 x non-embedding parameters", "seq_len": 128, "schedule": {"warmup": 0.1}},
            "sizes": sizes, "variants": variants, "fit": summarize_sweep(variants, replicates=replicates)}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    results = make_results()
    out = tmp_path_factory.mktemp("scaling-report")
    written = write_scaling_report(copy.deepcopy(results), out)
    saved = json.loads((out / "results.json").read_text(),
                       parse_constant=lambda name: pytest.fail(f"results.json holds {name}: not strict JSON"))
    return saved, out, written, (out / "report.md").read_text(), (out / "index.html").read_text()


def section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def row(markdown: str, name: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_every_file_is_written_and_the_figures_are_images(report):
    saved, out, written, _, _ = report
    assert written["results"] == out / "results.json" and written["html"] == out / "index.html"
    assert [p.name for p in written["figures"]] == list(FIGURES)
    assert saved["figures"] == [f"figures/{name}" for name in FIGURES]
    for name in FIGURES:
        path = out / "figures" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width = imread(path).shape[:2]
        assert width <= 900 and height >= 500  # 6 in at 150 dpi; shown at most 640 px wide
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temporary file


def test_results_json_holds_the_input_fit_and_derived_tables(report):
    saved, *_ = report
    assert saved["command"] == "attnres scaling --preset synthetic" and len(saved["variants"]) == 5
    assert saved["fit"]["advantage"]["saturating"][BLOCK]["at_max"]["value"] == pytest.approx(1.3, abs=0.05)
    losses = [r["final_val_loss"] for r in saved["variants"][0]["runs"] if r["size"] == size_name(5)]
    assert saved["tables"]["final_losses"]["standard"][size_name(5)]["mean"] == pytest.approx(np.mean(losses))
    assert saved["tables"]["flops_vs_standard"][BLOCK] == pytest.approx([1.02, 1.02])
    assert saved["tables"]["stability"]["standard"] == {"runs": 12, "recorded": 12, "loss_spikes": 12,
                                                       "grad_spikes": 24, "clipped_steps": 36, "steps": 360}
    assert saved["tables"]["stability"][FULL]["recorded"] == 0 and saved["tables"]["stability"][FULL]["steps"] is None


def test_the_conclusion_quotes_the_advantage_in_results_json(report):
    saved, _, _, md, html = report
    at = saved["fit"]["advantage"]["saturating"][BLOCK]["at_max"]
    c_max = saved["fit"]["compute_range"][1]
    sentence = (f"{BLOCK}: at the sweep's largest compute, {c_max:.2e} FLOPs, its compute advantage over standard is "
                f"{at['value']:.2f}× (95% interval {at['low']:.2f}× to {at['high']:.2f}×) under the saturating law. "
                f"The interval excludes 1: {BLOCK} needs less compute than standard for the same loss.")
    assert sentence in section(md, "Conclusion") and escape(sentence) in html
    full = saved["fit"]["advantage"]["saturating"][FULL]["at_max"]
    assert full["low"] < 1 < full["high"]
    assert (f"{full['value']:.2f}× (95% interval {full['low']:.2f}× to {full['high']:.2f}×) under the saturating "
            f"law. The interval contains 1: this sweep does not show that {FULL} differs") in md
    assert row(section(md, "Compute advantage over standard"), BLOCK)[:5] == [
        BLOCK, "saturating", f"{at['value']:.2f}×", f"{at['low']:.2f}× to {at['high']:.2f}×", "yes, ahead"]


def test_a_refused_fit_is_reported_as_refused_and_the_power_law_quoted(report):
    saved, _, _, md, _ = report
    error = saved["fit"]["laws"]["saturating"][TWO_SIZES]["error"]
    assert saved["fit"]["laws"]["saturating"][TWO_SIZES]["fit"] is None and "distinct compute values" in error
    power = saved["fit"]["advantage"]["power"][TWO_SIZES]["at_max"]
    conclusion = section(md, "Conclusion")
    assert (f"{TWO_SIZES}: the saturating fit of {TWO_SIZES} was refused ({error}). The power law's figure "
            f"instead: at the sweep's largest compute") in conclusion
    quoted = (f"is {power['value']:.2f}× (95% interval {power['low']:.2f}× to {power['high']:.2f}×) "
              "under the power law")
    assert quoted in conclusion
    fit_row = row(section(md, "Fit: saturating law"), TWO_SIZES)
    spread = saved["fit"]["laws"]["saturating"][TWO_SIZES]["seed_spread"]
    assert fit_row[1] == "4" and fit_row[2:7] == ["-"] * 5 and fit_row[7:] == [f"{spread:.4f}", "refused"]
    assert f"Refused or reduced: {TWO_SIZES}: {error}" in section(md, "Fit: saturating law")
    assert row(section(md, "Compute advantage over standard"), TWO_SIZES)[:4] == [
        TWO_SIZES, "saturating", "-", f"no fit of {TWO_SIZES}"]


def test_a_flagged_fit_is_said_and_the_power_law_quoted_with_its_caution(report):
    saved, _, _, md, _ = report
    entry = saved["fit"]["laws"]["saturating"][ZIGZAG]
    assert entry["misfit"] is True and entry["fit"] is not None
    conclusion = section(md, "Conclusion")
    assert (f"{ZIGZAG}: the saturating fit of {ZIGZAG} is flagged: its RMS log residual, "
            f"{entry['fit']['rms_log_residual']:.4f}, is more than 2× the seed spread, {entry['seed_spread']:.4f}") \
        in conclusion
    flagged = saved["fit"]["advantage"]["saturating"][ZIGZAG]["at_max"]["value"]
    assert (f"under the power law (the saturating fit gives {flagged:.2f}×); the power law too misses the "
            f"points of {ZIGZAG} and standard by more than 2× the seed spread, so this figure is rough") in conclusion
    assert row(section(md, "Fit: saturating law"), ZIGZAG)[-1] == "misfit"
    std, fit = row(section(md, "Fit: saturating law"), "standard"), saved["fit"]["laws"]["saturating"]["standard"]
    assert std[3:6] == [f"{fit['fit']['alpha']:.3g} [{fit['alpha'][0]:.3g}, {fit['alpha'][1]:.3g}]",
                        f"{fit['fit']['e']:.3g} [{fit['e'][0]:.3g}, {fit['e'][1]:.3g}]",
                        f"{fit['loss_at_max']['value']:.3f} [{fit['loss_at_max']['low']:.3f}, "
                        f"{fit['loss_at_max']['high']:.3f}]"]
    assert std[-1] == "ok"


def test_tables_print_the_sizes_losses_and_divergence_totals(report):
    saved, _, _, md, _ = report
    sizes = section(md, "Sizes")
    assert row(sizes, size_name(2)) == [size_name(2), "64", "6", "4", "2", "192", "294,912", "425,984", "5,898,240",
                                        "5.90", "300", f"{COMPUTE[2]:.2e}", "0, 1"]
    assert f"{BLOCK} 1.020×" in sizes and f"{FULL} 1.060×" in sizes
    assert row(section(md, "Rules"), "schedule") == ["schedule", '{"warmup":0.1}']
    stats = saved["tables"]["final_losses"]["standard"][size_name(0)]
    assert row(section(md, "Final losses"), "standard")[1] == f"{stats['mean']:.3f} ± {stats['std']:.3f}"
    assert row(section(md, "Final losses"), TWO_SIZES)[2] == "-"  # not trained at that size
    events = section(md, "Divergence events")
    assert row(events, "standard") == ["standard", "12 of 12", "12", "24", "36", "360"]
    assert row(events, FULL) == [FULL, "0 of 12", "n/a", "n/a", "n/a", "n/a"]
    assert "attnres scaling --preset synthetic" in md and "device_name Test CPU 9000" in md


def test_every_variant_keeps_its_one_style_in_every_figure(tmp_path, captured_figures):
    results = make_results(replicates=10)
    styles = variant_styles(results["variants"])
    for v in results["variants"]:
        assert styles[v["name"]] == style_of(v)
    write_scaling_report(results, tmp_path)
    md = (tmp_path / "report.md").read_text()
    for name in FIGURES:
        fig = captured_figures[name]
        assert_legible(name, fig)
        legend = fig.legends[0]  # below the axes, where it covers no data
        shown = {text.get_text(): to_hex(handle.get_color())
                 for text, handle in zip(legend.texts, legend.legend_handles)}
        for v in results["variants"]:
            label = next((label for label in shown if label.split(" (power law)")[0] == v["name"]), None)
            if name == "compute_advantage.png" and v["residual"] == "standard":
                assert label is None  # standard is the dashed line at 1
                continue
            assert shown[label] == style_of(v)["color"], (name, label)
        drawn_colours = {to_hex(line.get_color()) for line in fig.axes[0].lines if len(line.get_xdata())}
        assert {style_of(v)["color"] for v in results["variants"][1:]} <= drawn_colours
    assert f"{TWO_SIZES} (power law)" in [t.get_text() for t in captured_figures[FIGURES[0]].legends[0].texts]
    caption = md.split("figures/loss_vs_compute.png)", 1)[1].split("\n\n", 2)[1]
    assert f"The curves of {TWO_SIZES} are the power law" in caption


def test_an_advantage_beyond_standards_floor_is_said_in_words(tmp_path):
    rng = np.random.default_rng(1)
    variants = [variant("standard", "standard", ahead(1.0), rng),
                variant("denseformer", "denseformer", below_floor, rng)]
    write_scaling_report(make_results(variants, replicates=20), tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    at = saved["fit"]["advantage"]["saturating"]["denseformer"]["at_max"]
    assert at["value"] is None and at["beyond_floor_share"] == 1.0
    md = (tmp_path / "report.md").read_text()
    assert (f"its compute advantage over standard is {FLOOR} (its fitted loss is below standard's fitted floor E; so "
            "is it in 100% of the 20 bootstrap replicates) under the saturating law. The interval excludes 1") in md
    assert row(section(md, "Compute advantage over standard"), "denseformer")[2] == FLOOR
    assert "No run recorded divergence events" in md


def test_a_report_without_exactly_one_standard_is_refused(tmp_path):
    results = make_results(replicates=5)
    results["variants"][0]["residual"] = "full_attnres"
    with pytest.raises(ValueError, match="exactly one variant with residual 'standard'"):
        write_scaling_report(results, tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_the_report_layer_does_not_import_the_scaling_layer():
    code = ("import sys, attnres.report.scaling_report; "
            "print(any(m.startswith('attnres.scaling') for m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


def test_a_law_without_residuals_is_said_to_have_no_interval_and_the_power_law_quoted(tmp_path):
    rng = np.random.default_rng(3)
    variants = [variant("standard", "standard", ahead(1.0), rng, sizes=(0, 2, 5)),
                variant(BLOCK, "block_attnres", ahead(1.3), rng, sizes=(0, 2, 5), num_blocks=8)]
    for v in variants:  # one seed at three sizes: the three-parameter law goes through every point
        v["runs"] = [r for r in v["runs"] if r["seed"] == 0]
    write_scaling_report(make_results(variants, replicates=20), tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    conclusion = section((tmp_path / "report.md").read_text(), "Conclusion")
    reason = saved["fit"]["laws"]["saturating"]["standard"]["no_interval"]
    assert f"the saturating fit of standard has no interval: {reason}" in conclusion
    power = saved["fit"]["advantage"]["power"][BLOCK]["at_max"]
    assert (f"is {power['value']:.2f}× (95% interval {power['low']:.2f}× to {power['high']:.2f}×) under the power "
            "law (the saturating fit gives") in conclusion
    assert conclusion.count("95% interval") == 1  # the power law's; no zero-width saturating interval


def test_the_advantage_in_wall_clock_time_is_the_flops_advantage_times_relative_speed(tmp_path):
    results = make_results(replicates=20)
    largest = size_name(5)
    # standard's step 0.10 s every round; Block's 0.12 s: 1.2x the time for its 1.02x the FLOPs
    samples = {"standard": [0.10] * 7, BLOCK: [0.12] * 7}
    results["cost_size"] = largest
    results["cost"] = {"settings": {"repeats": 7, "warmup": 1, "noise_threshold": 0.25, "seed": 0, "batch_size": 8,
                                    "seq_len": 128, "precision": "fp32", "routing_impl": "auto", "routing": "lean",
                                    "device": "cpu"},
                       "variants": {name: {"train_step_s": {"median_s": xs[0], "samples_s": xs}, "memory": {}}
                                    for name, xs in samples.items()}}
    write_scaling_report(results, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    at = saved["fit"]["advantage"]["saturating"][BLOCK]["at_max"]
    speed = 1.02 / 1.2  # Block's FLOPs per second relative to standard's
    md = (tmp_path / "report.md").read_text()
    cells = row(section(md, "Measured step time and the advantage in wall-clock time"), BLOCK)
    assert cells[1].startswith("1.20× [1.20, 1.20]") and cells[2] == "1.020×" and cells[3] == f"{speed:.2f}×"
    assert cells[5] == f"{at['value'] * speed:.2f}× ({at['low'] * speed:.2f}× to {at['high'] * speed:.2f}×)"
