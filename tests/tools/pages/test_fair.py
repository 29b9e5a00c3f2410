"""The fair fight on the pages: the search and result tables, the kernel rerun and the later studies beside
it (the README's answer: tests/tools/pages/test_recommendation.py)."""

import json
import shutil
from pathlib import Path

import pytest

from tools.pages import fair
from tools.pages.render import Context
from tools.pages.sources import Results
from attnres.report.protocol_report import summarize_protocol

ROOT = Path(__file__).resolve().parents[3]
SHARED = ("scaling", "bench-fp32", "bench-bf16", "conversion", "published")
STANDARD = [4.60, 4.70, 4.65, 4.55]


def variant(name, residual, diffs, lr=6e-3, **options):
    runs = [{"seed": s, "final_test_loss": base + d, "final_val_loss": base + d + 0.01, "lr": lr}
            for s, (base, d) in enumerate(zip(STANDARD, diffs))]
    return {"name": name, "residual": residual, **options, "chosen_lr": lr, "edge": None, "extended": [],
            "grid": [{"lr": lr, "mean_val_loss": 4.6, "val_losses": [4.6, 4.6]}], "runs": runs}


def study(variants) -> dict:
    results = {"command": "attnres compare --preset fair_dense", "created": "2026-12-05T00:00:00",
               "machine": {"device_name": "AMD EPYC", "threads": 2, "cpu_capability": "AVX2", "torch": "2.13.0",
                           "cpu_native_bf16": False},
               "code_path": {"precision": "fp32", "routing_impl": "auto", "routing": "fused"},
               "protocol": {"lr_grid": [1.5e-3, 3e-3, 6e-3, 1.2e-2], "grid_seeds": 2, "max_extensions": 2,
                            "final_seeds": 4},
               "settings": {"model": {"num_layers": 16, "hidden_size": 64},
                            "train": {"steps": 240, "batch_size": 8, "seq_len": 128}, "data": {}, "min_lr_ratio": 0.1},
               "variants": variants}
    return {**results, "summary": summarize_protocol(results)}


@pytest.fixture
def ctx_of(tmp_path):
    for name in SHARED:
        shutil.copytree(ROOT / "results" / name, tmp_path / "results" / name)

    def make(variants) -> Context:
        (tmp_path / "results" / "fair-dense").mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / fair.FAIR_DENSE).write_text(json.dumps(study(variants)))
        return Context(Results(tmp_path), "README.md")
    return make


def others(block_diffs, full_diffs):
    return [variant("standard", "standard", [0, 0, 0, 0], lr=1.2e-2),
            variant("block_attnres (N=8)", "block_attnres", block_diffs, num_blocks=8),
            variant("full_attnres", "full_attnres", full_diffs),
            variant("delta_block (N=8)", "delta_block", [+0.05, +0.06, +0.04, +0.05], num_blocks=8)]


def test_the_fair_tables_show_the_choice_and_the_verdicts(ctx_of):
    ctx = ctx_of(others([-0.10, -0.12, -0.09, -0.11], [-0.11, -0.10, -0.12, -0.10]))
    results = fair.fair_results(ctx)
    assert "| full_attnres | 0.006 | 4 | -0.107 ± " in results and "| standard | 0.012 | 4 | baseline |" in results
    assert "full_attnres has the lowest test loss; block_attnres (N=8) is not distinguishable from it" in results
    assert "**4.600**" in fair.fair_search(ctx)


def test_the_kernel_rerun_is_set_beside_the_study_seed_by_seed(ctx_of, tmp_path):
    ctx = ctx_of(others([-0.10, -0.12, -0.09, -0.11], [-0.11, -0.10, -0.12, -0.10]))
    rerun = study(others([-0.13, -0.12, -0.09, -0.11], [-0.11, +0.02, -0.12, -0.10]))
    for v in rerun["variants"]:
        v["runs"] = v["runs"][:2]  # seeds 0 and 1
    rerun["machine"] = {**rerun["machine"], "cpu_capability": "DEFAULT"}
    (tmp_path / "results" / "fair-dense-kernels").mkdir()
    (tmp_path / "results" / fair.FAIR_KERNELS).write_text(json.dumps(rerun))
    moves = {(m["variant"], m["seed"]): m["moved"] for m in fair.kernel_moves(study(others(
        [-0.10, -0.12, -0.09, -0.11], [-0.11, -0.10, -0.12, -0.10])), rerun)}
    assert moves[("block_attnres (N=8)", 0)] == pytest.approx(-0.03) and moves[("full_attnres", 1)] == pytest.approx(0.12)
    text = fair.fair_kernels(ctx)
    assert "| full_attnres | -0.110 / -0.110 | -0.100 / +0.020 | 0.120 |" in text
    assert ("On PyTorch's DEFAULT kernels instead of AVX2, a run's own test loss moved by up to 0.120 nats "
            "(full_attnres, seed 1: +0.120), and the paired differences to standard, which take two runs' moves, "
            "by up to 0.120 (1 of 6 changed sign)") in text


def test_a_later_study_is_set_beside_the_fair_fight_and_a_changed_ranking_is_said(ctx_of, tmp_path):
    ctx = ctx_of(others([-0.10, -0.12, -0.09, -0.11], [-0.05, -0.06, -0.04, -0.05]))
    later = study(others([-0.02, -0.03, -0.01, -0.02], [-0.08, -0.07, -0.09, -0.08]))
    later["rates"] = {v["name"]: v["chosen_lr"] for v in later["variants"]}
    (tmp_path / "results" / "fair-pydocs").mkdir()
    (tmp_path / "results" / fair.FAIR_PYDOCS).write_text(json.dumps(later))
    text = fair.fair_pydocs(ctx)
    assert "| full_attnres | 0.006 | -0.050 ± " in text and "| -0.080 ± " in text and "| -0.090 to -0.070 | 4 |" in text
    assert ("rank differently in the two: full_attnres < block_attnres (N=8) < delta_block (N=8) on the Python "
            "documentation, against block_attnres (N=8) < full_attnres < delta_block (N=8) in the fair fight.") in text


def test_one_rate_for_all_is_set_beside_each_its_own(ctx_of, tmp_path):
    ctx = ctx_of(others([-0.10, -0.12, -0.09, -0.11], [-0.11, -0.10, -0.12, -0.10]))
    shutil.copytree(ROOT / "results" / "ablation", tmp_path / "results" / "ablation")
    text = fair.fair_vs_ablation(ctx)
    assert "| variant | Δ at lr 0.003 for all (95 % CI) | its own lr | Δ at its own lr (95 % CI) |" in text
    assert "| full_attnres | " in text and "| 0.006 | -0.107 ± " in text
    assert "delta_block (N=8) | " in text.splitlines()[-3]  # ordered by the fair fight's difference: worst last


def test_the_kimi_linear_study_gets_the_same_tables(ctx_of, tmp_path):
    ctx = ctx_of(others([-0.10, -0.12, -0.09, -0.11], [-0.05, -0.06, -0.04, -0.05]))
    kimi = study([*others([-0.02, -0.03, -0.01, -0.02], [-0.08, -0.07, -0.09, -0.08]),
                  variant("hyper_connections", "hyper_connections", [+0.12, +0.14, +0.10, +0.13])])
    (tmp_path / "results" / "fair-kimi-linear").mkdir()
    (tmp_path / "results" / fair.FAIR_KIMI).write_text(json.dumps(kimi))
    results = fair.fair_kimi_results(ctx)
    assert "| hyper_connections | 0.006 | 4 | +0.122 ± " in results and "fair-kimi-linear/results.json" in results
    assert "| full_attnres |" in fair.fair_kimi_search(ctx)
