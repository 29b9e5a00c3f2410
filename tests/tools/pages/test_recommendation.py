"""The README's answer: the headline follows the protocol's rule on whatever settings are committed, the table
has a column per setting with Holm's correction marked, and the protocol's own studies replace the 0.2 ones."""

import pytest

from tools.pages import recommendation

BASE = [4.60, 4.70, 4.65, 4.55, 4.62, 4.68, 4.58, 4.66]
WOBBLE = [0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0]


def results(gains: dict[str, float], steps=240, seeds=range(8), path_note="fair_dense", standard=0.0) -> dict:
    """A comparison's results: standard (shifted by `standard`) and each variant at standard's unshifted loss
    plus its gain and a wobble."""
    def runs(gain, shift=0.0):
        return [{"seed": s, "final_test_loss": b + shift + gain + (w if gain else 0.0)}
                for s, b, w in zip(seeds, BASE, WOBBLE)]
    variants = [{"name": "standard", "residual": "standard", "parameters": 920128, "runs": runs(0.0, standard)}]
    variants += [{"name": v, "residual": v, "parameters": 924352, "runs": runs(g)} for v, g in gains.items()]
    return {"command": f"attnres compare --preset {path_note}", "created": "2026-12-06T00:00:00",
            "machine": {"device_name": "AMD EPYC", "threads": 1, "cpu_capability": "AVX2", "torch": "2.13.0"},
            "code_path": {"precision": "fp32", "routing_impl": "auto", "routing": "fused"},
            "settings": {"model": {"num_layers": 16, "hidden_size": 64},
                         "train": {"steps": steps, "batch_size": 8, "seq_len": 128}},
            "variants": variants}


EVERYWHERE = {"block_attnres": -0.10, "hyper_connections": -0.02, "delta_block": 0.03}


def test_a_gain_in_every_setting_without_an_equal_time_arm_is_not_recommended(ctx_with):
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE), "fair-pydocs": results(EVERYWHERE),
                      "fair-kimi-linear": results(EVERYWHERE)})
    text = recommendation.recommendation_text(ctx)
    # Block AttnRes passes all that has run of the rule: not recommended, but not ruled out either
    assert text.startswith("**No variant is recommended yet.** Block AttnRes leads on the dense decoder, "
                           "the second corpus and Kimi Linear")
    assert text.endswith("the equal-time arms of Block AttnRes and hyper-connections have not run yet. For the "
                         "evidence at scale, see [the published results](#at-scale).")


def test_with_the_equal_time_arm_the_rule_recommends_and_says_why(ctx_with):
    # standard trained as long as Block's step costs, on the same seeds, gains 0.05: half of Block's lead remains
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE), "fair-pydocs": results(EVERYWHERE),
                      "fair-kimi-linear": results(EVERYWHERE),
                      "protocol-equal-time-block-attnres": results({}, steps=2000, standard=-0.05)})
    assert recommendation.equal_time_differences(ctx)["block_attnres"] == pytest.approx([-0.05 + w for w in WOBBLE])
    text = recommendation.recommendation_text(ctx)
    assert text.startswith("**Use Block AttnRes** (`residual: block_attnres`): better than standard on the dense "
                           "decoder after Holm's correction (-0.100, Holm p < 0.001)")
    assert "in every replication (pooled -0.100 [" in text and text.endswith("and at equal training time.")
    standard_long_wins = ctx_with(**{"protocol-equal-time-block-attnres": results({}, steps=2000, standard=-0.2)})
    # Block AttnRes is reversed at equal time; hyper-connections, whose arm has not run, could still pass
    text = recommendation.recommendation_text(standard_long_wins)
    assert text.startswith("**No variant is recommended yet.** Block AttnRes leads on the dense decoder, the second "
                           "corpus and Kimi Linear (-0.100 on the dense decoder, Holm p < 0.001) but is worse than "
                           "standard at equal training time (+0.100).")


def test_a_replication_of_the_other_sign_is_named(ctx_with):
    worse_on_kimi = {**EVERYWHERE, "block_attnres": 0.2}
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE), "fair-kimi-linear": results(worse_on_kimi)})
    text = recommendation.recommendation_text(ctx)
    assert ("Block AttnRes leads on the dense decoder (-0.100, Holm p < 0.001) but is worse "
            "than standard on Kimi Linear; hyper-connections lead on Kimi Linear") in text


def test_the_table_has_a_column_per_setting_and_bolds_what_survives_holm(ctx_with):
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE), "fair-kimi-linear": results({"block_attnres": 0.001})})
    table = recommendation.recommendation_table(ctx).splitlines()
    assert table[0] == ("| residual | its lr (highest stable) | dense | Kimi Linear | equal time | "
                        "train step, fp32, 24x256 / 30x576 | parameters |")
    block = next(line for line in table if line.startswith("| `block_attnres` |"))
    assert "| **-0.100\u00a0±\u00a0" in block and "| +0.001\u00a0±\u00a0" in block and "| not run |" in block
    assert "| +0.5\u00a0% |" in block and table[2].endswith("| 0.92M |")
    assert any(line.startswith("| `mhc` (secondary) | - |") for line in table)


def test_the_protocols_study_replaces_the_0_2_one_when_it_lands(ctx_with):
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE),
                      "protocol-dense": results({"hyper_connections": -0.3}, steps=1840, seeds=range(1000, 1008),
                                                path_note="protocol_dense")})
    found = recommendation.setting_results(ctx)
    assert found["dense"][0] == "protocol-dense/results.json"
    notes = recommendation.recommendation_notes(ctx)
    assert "dense: 16 layers x 64, 1840 steps of 8 x 128 tokens (2.05 tokens per parameter for standard), 8 seeds, " \
        "the protocol" in notes
    assert "0.2 protocol" not in notes


def test_once_the_protocols_main_study_lands_only_its_settings_count_and_a_missing_one_fails_the_rule(ctx_with):
    protocol = dict(steps=1840, seeds=range(1000, 1008), path_note="protocol_dense")
    ctx = ctx_with(**{"fair-dense": results(EVERYWHERE), "fair-dense-long": results(EVERYWHERE),
                      "fair-kimi-linear": results(EVERYWHERE), "protocol-dense": results(EVERYWHERE, **protocol),
                      "protocol-kjv": results(EVERYWHERE, steps=1840, seeds=range(1000, 1008)),
                      "protocol-equal-time-block-attnres": results({}, **{**protocol, "steps": 1990})})
    found = recommendation.setting_results(ctx)
    assert list(found) == ["dense", "second corpus", "Kimi Linear"] and found["Kimi Linear"][1] is None
    text = recommendation.recommendation_text(ctx)
    assert text.startswith("**No variant is recommended yet.** Block AttnRes leads on the dense decoder "
                           "and the second corpus")
    # Block AttnRes's arm has run, hyper-connections' (which also survives Holm) has not
    assert "; Kimi Linear and the equal-time arm of hyper-connections have not run yet." in text
    assert "standard is ahead" not in text
    header, _, *rows = recommendation.recommendation_table(ctx).splitlines()
    assert header.startswith("| residual | its lr (highest stable) | dense | second corpus | Kimi Linear | equal time |")
    block = next(line for line in rows if line.startswith("| `block_attnres` |"))
    assert block.count("| not run |") == 1  # Kimi Linear; its equal-time arm has run
    notes = recommendation.recommendation_notes(ctx)
    assert "Kimi Linear: not run yet (`tools/studies/protocol.sh protocol_kimi_linear`)" in notes
    assert "0.2 protocol" not in notes and "Kimi Linear" not in recommendation.recommendation_sources(ctx)


def test_the_notes_give_the_secondary_variants_seeds_and_each_primary_variants_equal_time_factor(ctx_with):
    main = results({"block_attnres": -0.1, "hyper_connections": -0.2, "delta_block": -0.1, "mhc": 0.0},
                   steps=1840, seeds=range(1000, 1008), path_note="protocol_dense")
    for variant in main["variants"]:
        variant["primary"] = variant["residual"] != "mhc"
        if not variant["primary"]:
            variant["runs"] = variant["runs"][:4]
    seconds = {"standard": 0.10, "block_attnres": 0.115, "hyper_connections": 0.179, "delta_block": 0.111}
    main["cost"] = {"machine": {"threads": 1}, "settings": {"noise_threshold": 0.25, "repeats": 11}, "variants": {
        name: {"train_step_s": {"samples_s": [s] * 5, "median_s": s}} for name, s in seconds.items()}}
    notes = recommendation.recommendation_notes(ctx_with(**{"protocol-dense": main}))
    assert "1840 steps of 8 x 128 tokens (2.05 tokens per parameter for standard), 8 seeds (4 for the secondary " \
        "variants), the protocol" in notes
    assert "costs at the dense setting's own shape on one thread (Block AttnRes 1.15x, hyper-connections 1.79x " \
        "and Delta Block 1.11x)" in notes
