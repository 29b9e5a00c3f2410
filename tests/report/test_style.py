"""One look per variant: the same colour and marker in every figure of every report, and all apart."""

import matplotlib.colors

from attnres.compare.presets import load_preset
from attnres.report.variant_names import variant_name
from attnres.report.compare_report import write_report
from attnres.report.style import series_styles, style_of, variant_style
from tests.report.test_compare_report import ODD_NAME, make_results


def look(style):
    return (style["color"], style["marker"], style["linestyle"], style["markerfacecolor"])


def test_the_study_variants_all_look_different():
    variants = load_preset("study").variants
    assert len(variants) == 13
    looks = {variant_name(v): look(style_of(v)) for v in variants}
    assert len(set(looks.values())) == 13, looks
    # a block count shades its residual's colour; the residual decides the hue
    block = [style_of(v)["color"] for v in variants if v["residual"] == "block_attnres"]
    assert variant_style("block_attnres", 8)["color"] == variant_style("block_attnres")["color"] == "#ff7f0e"
    hues = {round(matplotlib.colors.rgb_to_hsv(matplotlib.colors.to_rgb(c))[0], 2) for c in block}
    assert len(hues) == 1


def test_a_style_depends_on_the_variant_only():
    assert variant_style("delta_block", 4) == variant_style("delta_block", 4)
    assert variant_style("my_new_mixer") == variant_style("my_new_mixer")  # registered later: still stable
    assert variant_style("delta_block", 4, tags=("gate",)) != variant_style("delta_block", 4)
    # two checkpoints of one variant keep its colour and marker but not its line style
    styles = series_styles({"a step 10": {"residual": "full_attnres"}, "a step 20": {"residual": "full_attnres"}})
    first, second = styles.values()
    assert first["color"] == second["color"] and first["marker"] == second["marker"]
    assert first["linestyle"] != second["linestyle"]


def test_each_router_ablation_has_its_own_look_in_its_residual_colour():
    base = {"residual": "full_attnres"}
    ablations = [{"router_query": "input_dependent"}, {"router_weights": "sigmoid"}, {"router_key_norm": False}]
    looks = [look(style_of({**base, **a})) for a in ablations]
    assert len(set(looks + [look(style_of(base))])) == 4
    assert {style_of({**base, **a})["color"] for a in ablations} == {style_of(base)["color"]}
    nested = [{"residual_options": {"query": "input_dependent"}}, {"residual_options": {"weights": "sigmoid"}},
              {"residual_options": {"key_norm": False}}]
    assert [look(style_of({**base, **a})) for a in nested] == looks  # today's names, under residual_options


def line_colors(fig):
    return {line.get_label(): matplotlib.colors.to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_every_compare_figure_gives_a_variant_its_colour(tmp_path, captured_figures):
    results = make_results()
    write_report(results, tmp_path)
    expected = {v["name"]: style_of(v)["color"] for v in results["variants"]}
    figures = ["val_loss.png", "max_weight_by_depth.png", "hidden_rms_by_depth.png"]
    for name in figures:
        colors = line_colors(captured_figures[name])
        assert colors and all(colors[label] == expected[label] for label in colors), (name, colors)
    # the max-weight plot leaves standard out: full_attnres keeps blue all the same
    assert line_colors(captured_figures["max_weight_by_depth.png"])["full_attnres"] == "#1f77b4"
    cost = captured_figures["cost.png"].axes[0]
    bars = [matplotlib.colors.to_hex(patch.get_facecolor()[:3]) for patch in cost.patches]
    assert bars == [expected["full_attnres"], expected[ODD_NAME]]
