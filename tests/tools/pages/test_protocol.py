"""The protocol's results on the results page: a study's fitted rates and tests, the rule's evidence per primary
variant with each condition, and the check on another floating-point path, all from the committed files."""

from tools.pages import protocol

PAGE = "docs/explanation/results.md"
BASE = [4.60, 4.70, 4.65, 4.55, 4.62, 4.68, 4.58, 4.66] * 2
WOBBLE = [0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0] * 2
NAMES = {"standard": "standard", "block_attnres": "block_attnres (N=8)", "hyper_connections": "hyper_connections",
         "delta_block": "delta_block (N=8)", "mhc": "mhc"}


def study(gains: dict[str, float], seeds=range(1000, 1016), capability="AVX512") -> dict:
    """A fitted protocol study's results: standard at BASE, each variant at BASE + its gain + a wobble."""
    variants = []
    for residual, name in NAMES.items():
        gain = gains.get(residual, 0.0)
        runs = [{"seed": s, "final_val_loss": b, "final_test_loss": b + gain + (w if gain else 0.0),
                 "machine": {"cpu_capability": capability}} for s, b, w in zip(seeds, BASE, WOBBLE)]
        fit = {"rate": 0.005, "low": 0.004, "high": 0.006, "vertex_inside": True, "highest_stable": 0.012}
        variants.append({"name": name, "residual": residual, "primary": residual != "mhc", "chosen_lr": 0.005,
                         "fit": fit, "parameters": 920128, "runs": runs})
    return {"command": "attnres compare --preset protocol_dense", "created": "2026-12-08T00:00:00",
            "machine": {"device_name": "AMD EPYC", "threads": 2, "cpu_capability": capability, "torch": "2.13.0"},
            "protocol": {"choice": "fit", "failure_threshold": 7.6},
            "settings": {"model": {"num_layers": 16, "hidden_size": 64},
                         "train": {"steps": 1840, "batch_size": 8, "seq_len": 128}},
            "tokens": {"per_run": 1_884_160, "train_split": 3_050_000}, "variants": variants}


GAINS = {"block_attnres": -0.1, "hyper_connections": 0.003, "delta_block": -0.004, "mhc": 0.2}


def row(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_studys_fitted_rates_and_tests_with_holm_per_family(ctx_with):
    text = protocol.protocol_tests(ctx_with(PAGE, **{"protocol-dense": study(GAINS)}))
    assert row(text, "| block_attnres (N=8) | 0.005 |")[2:] == ["[0.004, 0.006]", "vertex", "0.012"]
    block = row(text, "| block_attnres (N=8) | primary |")
    assert block[2].startswith("-0.100 [") and block[6] == "better" and block[7] == "0 of 16 [0.00, 0.21]"
    assert row(text, "| mhc | secondary |")[6] == "worse"
    assert "Best-test among the primary variants and standard: block_attnres is shown better" in text
    assert "(0.62 times). That is 2.05 tokens per parameter, every one counted." in text


def test_the_rule_table_shows_each_condition_and_a_replication_not_run(ctx_with):
    ctx = ctx_with(PAGE, **{"protocol-dense": study(GAINS), "protocol-kjv": study(GAINS, range(1000, 1008))})
    text = protocol.protocol_rule(ctx)
    assert text.startswith("| variant | dense [95 % CI] | Holm p | second corpus | Kimi Linear | pooled")
    block = row(text, "| Block AttnRes |")
    assert block[2] == "< 0.001" and block[3] == "-0.100" and block[4] == "not run"
    assert block[5].startswith("-0.100 [") and block[5].endswith("], 2 of 3 settings")  # an interim pool says so
    assert block[6:] == ["not run", "yes", "not yet", "not yet", "no"]  # Kimi Linear and the arm still to run
    hyper = row(text, "| hyper-connections |")
    assert hyper[3] == "+0.003" and hyper[6:] == ["not needed", "no", "no", "-", "no"]  # no arm without condition 1
    both = ctx_with(PAGE, **{"protocol-kimi-linear": study(GAINS, range(1000, 1008)),
                       "protocol-equal-time-block-attnres": study({}, range(1000, 1016))})
    block = row(protocol.protocol_rule(both), "| Block AttnRes |")
    assert block[6].startswith("-0.100\u00a0±\u00a0") and block[7:] == ["yes", "yes", "yes", "**recommended**"]
    assert block[5].startswith("-0.100 [") and block[5].endswith("]")  # the protocol's pool over every setting


def test_another_floating_point_path_reports_moves_and_any_change_of_sign_or_decision(ctx_with):
    rerun = study({**GAINS, "delta_block": 0.004}, range(1000, 1008), capability="AVX2")
    rerun["variants"] = [v for v in rerun["variants"] if v["residual"] != "mhc"]
    text = protocol.protocol_paths(ctx_with(PAGE, **{"protocol-dense": study(GAINS), "protocol-dense-avx2": rerun}))
    assert text.startswith("| variant | Δ on AVX512 | Δ on AVX2 |")
    assert row(text, "| Block AttnRes |")[4:] == ["no", "no", "0.0000"]
    assert row(text, "| Delta Block |")[4:6] == ["yes", "no"] and row(text, "| Delta Block |")[6] == "0.0080"
    assert "Seeds 1000–1007" in text and "(delta_block (N=8), seed" in text and "over 32 runs" in text
