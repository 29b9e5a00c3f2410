"""`attnres analyze`: two tiny trained runs (block_attnres, standard) -> every report file, the right shapes."""

import json
import math

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from attnres.cli import main
from attnres.report.depth_analysis_plots import (plot_cosine_matrices, plot_entropy_by_depth, plot_grad_norms_by_depth,
                                          plot_routing_heatmap_split, split_routers)
from attnres.report.depth_analysis_report import cosine_routers
from attnres.report.plots import figure_legend
from attnres.report.style import variant_style
from attnres.train import evaluate_checkpoint
from tests.report.test_plots import assert_legible

LAYERS = 2
SHARED_FIGURES = {"max_weight_by_depth.png", "entropy_by_depth.png", "hidden_rms_by_depth.png",
                  "grad_norm_by_depth.png"}


def content_axes(fig: Figure):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def assert_readable(name: str, fig: Figure, legend: bool) -> None:
    """A title, labelled axes on every panel; a legend where a line panel has more than one line;
    every text legible on a phone (`assert_legible`)."""
    for ax in content_axes(fig):
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), name
        if legend and len(ax.get_lines()) > 1:
            assert figure_legend(fig) is not None, name
    assert_legible(name, fig)


def test_analyze_writes_every_file_with_the_right_shapes(runs, cache, tmp_path, captured_figures, capsys):
    _, dirs = runs
    out = tmp_path / "report"
    standard_ckpt = sorted((dirs["standard"] / "checkpoints").iterdir())[-1]  # a checkpoint dir, not a run dir
    assert main(["analyze", str(dirs["block_attnres"]), str(standard_ckpt), "--out", str(out),
                 "--max-batches", "2"]) == 0
    assert "summary.md" in capsys.readouterr().out

    analysis = json.loads((out / "analysis.json").read_text())
    block, standard = analysis["checkpoints"]
    assert [block["label"], standard["label"]] == ["block_attnres (N=2) step 6", "standard step 6"]
    assert analysis["settings"] == {"max_batches": 2, "device": "cpu", "causal": False, "causal_routers": None,
                                    "data": None, "batch": None}
    assert block["causal"] is None and standard["causal"] is None

    stats = block["depth_stats"]
    routers = 2 * LAYERS + 1
    assert len(stats["source_names"]) == len(stats["mean_weights"]) == len(stats["max_weight"]) == routers
    assert len(stats["entropy"]) == len(stats["effective_sources"]) == routers
    for names, weights, cosines in zip(stats["source_names"], stats["mean_weights"], block["source_cosines"]):
        assert len(weights) == len(names) and math.isclose(sum(weights), 1.0, abs_tol=1e-6)
        assert len(cosines) == len(names) and all(len(row) == len(names) for row in cosines)
    assert len(block["grad_norms"]) == 2 * LAYERS and all(g > 0 for g in block["grad_norms"])
    assert len(stats["hidden_rms"]) == 2 * LAYERS + 1
    assert block["cosine_routers"] == cosine_routers(stats["source_names"]) != []
    assert 0 < block["summary"]["max_weight_deep"] <= 1 and block["summary"]["mean_entropy"] >= 0

    std = standard["depth_stats"]
    assert std["source_names"] == std["mean_weights"] == std["max_weight"] == standard["source_cosines"] == []
    assert len(std["hidden_rms"]) == 2 * LAYERS + 1 and len(standard["grad_norms"]) == 2 * LAYERS
    assert standard["summary"]["max_weight_deep"] is None and standard["figures"] == {}
    assert any("standard step 6" in note for note in analysis["notes"])

    # the validation loss is `attnres eval`'s on the same batches
    expected = evaluate_checkpoint(standard_ckpt, max_batches=2)
    assert standard["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-6)
    assert block["num_tokens"] == 2 * 4 * 32 and block["num_batches"] == 2

    # every file exists, is referenced by both documents, and every figure is readable
    slug = "block_attnres-n-2-step-6"
    expected_pngs = SHARED_FIGURES | {f"routing_{slug}.png", f"cosines_{slug}.png"}
    written = {p.name for p in (out / "figures").glob("*.png")}
    assert written == expected_pngs == set(captured_figures)
    assert sorted(analysis["figures"]) == sorted(f"figures/{n}" for n in written)
    summary, html = (out / "summary.md").read_text(), (out / "index.html").read_text()
    for name in written:
        assert (out / "figures" / name).stat().st_size > 1000
        assert f"figures/{name}" in summary and f"figures/{name}" in html
    for label in ("block_attnres (N=2) step 6", "standard step 6"):
        assert f"| {label} |" in summary and label in html
    for name, fig in captured_figures.items():
        assert_readable(name, fig, legend=True)
    # lines with one per checkpoint: both checkpoints in RMS and gradient plots, hence legends
    for name in ("hidden_rms_by_depth.png", "grad_norm_by_depth.png"):
        ax = content_axes(captured_figures[name])[0]
        assert len(ax.get_lines()) == 2
        assert [t.get_text() for t in figure_legend(captured_figures[name]).get_texts()] == [block["label"],
                                                                                                standard["label"]]
    heatmap = content_axes(captured_figures[f"routing_{slug}.png"])
    assert [ax.get_title() for ax in heatmap] == ["attention routers", "MLP routers (+ final)"]
    assert [t.get_text() for t in heatmap[1].get_yticklabels()] == ["1 mlp", "3 mlp", "final"]
    # each variant in its one style, the one the comparison report gives it too
    for name in ("hidden_rms_by_depth.png", "grad_norm_by_depth.png"):
        colors = [to_hex(line.get_color()) for line in content_axes(captured_figures[name])[0].get_lines()]
        assert colors == [variant_style("block_attnres", 2)["color"], variant_style("standard")["color"]]
    # the cosine panels stack in one column of a figure no wider than any other
    cosines = captured_figures[f"cosines_{slug}.png"]
    assert len({round(ax.get_position().x0, 3) for ax in content_axes(cosines)}) == 1


def test_the_causal_check_reports_every_chosen_router_with_its_figure(runs, cache, tmp_path, captured_figures):
    _, dirs = runs
    out = tmp_path / "report"
    assert main(["analyze", str(dirs["block_attnres"]), str(dirs["standard"]), "--out", str(out),
                 "--max-batches", "1", "--causal-routers", "2", "4"]) == 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["settings"]["causal"] is True and analysis["settings"]["causal_routers"] == [2, 4]
    block, standard = analysis["checkpoints"]
    assert standard["causal"] is None  # no routers
    causal = block["causal"]
    assert [r["router"] for r in causal["routers"]] == [2, 4]
    # the clean loss of the reference-routed model is the checkpoint's own validation loss
    assert causal["clean_loss"] == pytest.approx(block["val_loss"], rel=1e-5)
    for r in causal["routers"]:
        names = block["depth_stats"]["source_names"][r["router"]]
        assert r["source_names"] == names and len(r["mass"]) == len(names)
        assert r["mass"] == pytest.approx(block["depth_stats"]["mean_weights"][r["router"]], abs=1e-6)
        assert set(r["effect"]) == {"zero", "mean"} and all(len(v) == len(names) for v in r["effect"].values())
        assert any(v != 0.0 for v in r["effect"]["zero"])  # ablating a source of a trained router matters
    slug = "block_attnres-n-2-step-6"
    assert f"figures/causal_{slug}.png" in analysis["figures"]
    summary = (out / "summary.md").read_text()
    assert "## Causal check of routing" in summary and f"figures/causal_{slug}.png" in summary
    assert "| block_attnres (N=2) step 6 | zero |" in summary and "| block_attnres (N=2) step 6 | mean |" in summary
    assert_readable("causal", captured_figures[f"causal_{slug}.png"], legend=True)


def test_labels_and_duplicate_default_labels(runs, cache, tmp_path):
    _, dirs = runs
    out = tmp_path / "report"
    assert main(["analyze", str(dirs["standard"]), str(dirs["standard"]), "--out", str(out),
                 "--max-batches", "1"]) == 0
    labels = [e["label"] for e in json.loads((out / "analysis.json").read_text())["checkpoints"]]
    assert labels == ["standard step 6 [standard]", "standard step 6 [standard] #2"]
    assert main(["analyze", str(dirs["standard"]), "--labels", "baseline", "--out", str(out),
                 "--max-batches", "1"]) == 2  # another report's folder (two checkpoints, not one)
    assert main(["analyze", str(dirs["standard"]), "--labels", "baseline", "--out", str(out),
                 "--max-batches", "1", "--force"]) == 0
    assert json.loads((out / "analysis.json").read_text())["checkpoints"][0]["label"] == "baseline"
    assert "| baseline |" in (out / "summary.md").read_text()


def test_bad_input_fails_clearly(runs, cache, tmp_path, capsys):
    _, dirs = runs
    out = str(tmp_path / "report")
    assert main(["analyze", str(tmp_path / "nope"), "--out", out]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
    assert main(["analyze", str(tmp_path / "empty-run"), "--out", out]) == 1
    assert "has no complete checkpoint" in capsys.readouterr().err
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert main(["analyze", str(hf), "--out", out]) == 1
    assert "Hugging Face-format directory" in capsys.readouterr().err
    assert main(["analyze", str(dirs["standard"]), "--labels", "a", "b", "--out", out]) == 2
    assert "one per checkpoint" in capsys.readouterr().err
    assert main(["analyze", str(dirs["standard"]), "--max-batches", "0", "--out", out]) == 2
    assert "max_batches must be a positive integer" in capsys.readouterr().err
    assert main(["analyze", str(dirs["block_attnres"]), "--causal-routers", "99", "--out", out,
                 "--max-batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "router index 99 out of range" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()  # nothing is written for bad input


def test_router_panels_and_cosine_choice():
    assert split_routers(5) == ([0, 2], [1, 3, 4])  # the final router joins the MLP panel
    assert split_routers(4) == ([0, 2], [1, 3])
    assert split_routers(0) == ([], [])
    full = [["e"] + [f"d{k}" for k in range(s)] for s in range(8)] + [["e"] + [f"d{k}" for k in range(8)]]
    assert cosine_routers(full) == [4, 6, 7, 8]
    assert cosine_routers(full[:-1]) == [4, 6, 7]  # delta variants: no final router
    delta_block = [["e"], ["e"], ["e", "D1"], ["e", "D1"]]
    assert cosine_routers(delta_block) == [2, 3]
    assert cosine_routers([["e"], ["e"]]) == [] and cosine_routers([]) == []


def test_plot_functions_give_readable_figures(tmp_path, captured_figures):
    names = [["e"], ["e", "p"], ["e", "b1"], ["e", "b1", "p"], ["e", "b1", "b2"]]
    weights = [[1.0], [0.6, 0.4], [0.3, 0.7], [0.2, 0.3, 0.5], [0.1, 0.2, 0.7]]
    plot_routing_heatmap_split(names, weights, tmp_path / "heat.png", "Routing")
    plot_cosine_matrices({"router 3 (MLP)": (names[3], [[1, 0.5, 0.2], [0.5, 1, -0.3], [0.2, -0.3, 1]]),
                          "router 4 (final)": (names[4], [[1, 0, 0], [0, 1, 0], [0, 0, 1]])},
                         tmp_path / "cos.png", "Cosines")
    plot_cosine_matrices({}, tmp_path / "cos_empty.png", "Cosines")
    plot_grad_norms_by_depth({"a": [1.0, 2.0, 3.0, 400.0], "b": [1.0, math.nan, 1.0, 1.0]}, tmp_path / "g.png",
                             "Gradients")
    plot_entropy_by_depth({"a": [None, 0.6, 0.5, 0.9, 1.0], "b": [None, 0.2, 0.1, 0.3]},
                          {"a": [None, 1.8, 1.6, 2.4, 2.7], "b": [None, 1.2, 1.1, 1.3]}, tmp_path / "ent.png",
                          "Entropy")
    plot_entropy_by_depth({"standard": []}, {"standard": []}, tmp_path / "ent_empty.png", "Entropy")
    assert set(captured_figures) == {"heat.png", "cos.png", "cos_empty.png", "g.png", "ent.png", "ent_empty.png"}
    for name, fig in captured_figures.items():
        assert (tmp_path / name).stat().st_size > 1000
        assert fig.get_suptitle() or content_axes(fig)[0].get_title(), name
        assert_readable(name, fig, legend=True)
    assert len(content_axes(captured_figures["cos.png"])) == 2
    assert content_axes(captured_figures["g.png"])[0].get_yscale() == "log"  # values span 400x
    for ax in content_axes(captured_figures["ent.png"]):
        assert len(ax.get_lines()) == 2
    assert figure_legend(captured_figures["ent.png"]) is not None
