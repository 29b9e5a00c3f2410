"""The plan of a protocol study (`attnres compare --dry-run`): protocol_gpu's size and token budget, run
counts that follow the preset, FLOPs and GPU-hours, commands that reproduce compare's settings, and a dry
run that trains and writes nothing."""

import math
import shlex

import pytest
import torch
import yaml

import attnres.train.trainer as trainer
from attnres.cli import build_parser, main
from attnres.common.errors import InputError
from attnres.compare.plan import PlannedRun, Throughput, plan_protocol, plan_text, run_config, train_command
from attnres.compare.presets import load_preset
from attnres.compare.tune import run_protocol
from attnres.model import AttnResLM
from attnres.model.flops import training_flops
from attnres.train.run_config import RunConfigError, load_run_config
from tests.compare.test_tune import write_preset

LAUNCHER = ["torchrun", "--standalone", "--nproc-per-node", "8", "-m", "attnres"]


@pytest.fixture(scope="module")
def gpu():
    preset = load_preset("protocol_gpu")
    return preset, plan_protocol(preset, "results/protocol-gpu")


def test_standard_has_about_125m_parameters_counted_on_the_meta_device(gpu):
    preset, plan = gpu
    standard = plan.variant("standard")
    assert abs(standard.parameters - 125e6) <= 0.1 * 125e6
    config = run_config(plan, plan.runs[0]).model.with_vocab_size(preset.run["model"]["vocab_size"])
    with torch.device("meta"):  # as tune.protocol_results counts them
        assert standard.parameters == sum(p.numel() for p in AttnResLM(config).parameters())
    assert plan.vocab_size == 50304 and plan.seq_len == 1024


def test_every_primary_variant_sees_at_least_20_tokens_per_parameter(gpu):
    _, plan = gpu
    primary = [v for v in plan.variants if v.primary]
    assert [v.name for v in primary] == ["standard", "block_attnres (N=8)", "hyper_connections", "delta_block (N=8)"]
    assert all(v.tokens_per_parameter >= 20 for v in primary), [(v.name, v.tokens_per_parameter) for v in primary]
    assert plan.tokens_per_step == 512 * 1024 and {v.tokens for v in plan.variants} == {plan.steps * 512 * 1024}


def test_run_counts_follow_the_preset(gpu):
    preset, plan = gpu
    protocol = preset.protocol
    assert len(protocol.lr_grid) == 6 and protocol.grid_seeds == 2 and preset.seeds == 16
    assert plan.count("grid") == len(preset.variants) * len(protocol.lr_grid) * protocol.grid_seeds == 96
    primaries = sum(protocol.is_primary(v) for v in preset.variants)
    secondaries = len(preset.variants) - primaries
    assert plan.count("final") == 16 * primaries + protocol.secondary_seeds * secondaries == 96
    assert plan.extension_runs == len(preset.variants) * protocol.max_extensions * protocol.grid_seeds
    for variant in plan.variants:
        grid = {(r.rate, r.seed) for r in plan.runs if r.variant == variant.name and r.stage == "grid"}
        assert grid == {(rate, seed) for rate in protocol.lr_grid for seed in range(protocol.grid_seeds)}
        finals = [r.seed for r in plan.runs if r.variant == variant.name and r.stage == "final"]
        assert finals == list(variant.final_seeds) == list(range(1000, 1000 + (16 if variant.primary else 8)))


def test_no_final_seed_is_a_grid_seed(gpu):
    _, plan = gpu
    grid = {r.seed for r in plan.runs if r.stage == "grid"}
    final = {r.seed for r in plan.runs if r.stage == "final"}
    assert grid == {0, 1} and final and not grid & final


def test_fewer_final_seeds_cap_the_secondary_ones_too(gpu):
    preset, _ = gpu
    plan = plan_protocol(preset, seeds=4)
    assert {len(v.final_seeds) for v in plan.variants} == {4}


def test_flops_follow_the_accounting_and_double_with_the_steps(gpu):
    _, plan = gpu
    for variant in plan.variants:
        config = run_config(plan, PlannedRun("grid", variant.name, 1e-3, 0)).model.with_vocab_size(plan.vocab_size)
        assert variant.flops_per_run == training_flops(config, variant.tokens, plan.seq_len)
        six_n_t = 6 * variant.parameters * variant.tokens  # 6 N T, embeddings in N, plus attention
        assert six_n_t < variant.flops_per_run < 1.3 * six_n_t
    doubled = plan_protocol(load_preset("protocol_gpu", [f"train.steps={2 * plan.steps}"]))
    for one, two in zip(plan.variants, doubled.variants):
        assert two.parameters == one.parameters and two.tokens == 2 * one.tokens
        assert two.flops_per_run == 2 * one.flops_per_run
    assert doubled.flops == 2 * plan.flops
    assert plan.flops == sum(v.runs * v.flops_per_run for v in plan.variants)
    assert plan.max_flops == plan.flops + sum(v.extension_runs * v.flops_per_run for v in plan.variants)


def test_gpu_hours_follow_the_stated_throughput(gpu):
    preset, plan = gpu
    hours = plan.flops / (989e12 * 0.4) / 3600
    assert plan.throughput.hours(plan.flops) == pytest.approx(hours)
    text = plan_text(plan)
    assert f"{hours:,.0f} GPU-hours on H100 SXM, bf16 dense at 989 TFLOP/s peak x 40% MFU" in text
    slower = plan_protocol(preset, throughput=Throughput(mfu=0.2, name="a slower GPU"))
    assert slower.throughput.hours(slower.flops) == pytest.approx(2 * hours)
    assert "a slower GPU at 989 TFLOP/s peak x 20% MFU" in plan_text(slower)
    with pytest.raises(InputError, match=r"throughput.mfu must be a number in \(0, 1\], got 1.5"):
        Throughput(mfu=1.5)


@pytest.mark.parametrize("name", ["protocol_gpu", "protocol_dense"])
def test_commands_train_exactly_what_compare_would(name, tmp_path):
    preset = load_preset(name)
    plan = plan_protocol(preset, tmp_path / "study")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "base-run.yaml").write_text(plan.base_config)
    for variant in plan.variants:
        for run, rate in [(next(r for r in plan.runs if r.variant == variant.name and r.stage == stage), rate)
                          for stage, rate in (("grid", None), ("final", 2.5e-3))]:
            argv = shlex.split(train_command(plan, run, rate))
            assert argv[:6] == LAUNCHER
            args = build_parser().parse_args(argv[6:])  # what torchrun hands attnres
            assert (args.command, args.device, args.config) == ("train", "cuda", plan.base_config_path)
            assert load_run_config(args.config, args.set).to_dict() == run_config(plan, run, rate).to_dict()


def test_a_final_run_needs_its_fitted_rate(gpu):
    _, plan = gpu
    final = next(r for r in plan.runs if r.stage == "final")
    with pytest.raises(InputError, match="a final run of standard needs a positive rate"):
        train_command(plan, final)


def test_a_pretrained_tokenizer_needs_a_stated_vocabulary():
    preset = load_preset("protocol_gpu", ["model.vocab_size=auto"])
    with pytest.raises(RunConfigError, match="run.model.vocab_size must be set with a pretrained tokenizer"):
        plan_protocol(preset)


def test_runs_launched_by_the_commands_are_taken_up_by_compare_without_training(tmp_path, monkeypatch):
    """The grid trained as the plan's commands say (in this process, on the CPU, not under torchrun):
    compare resumes each at its last checkpoint and trains only the runs that are left."""
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    preset = load_preset(write_preset(tmp_path))
    plan = plan_protocol(preset, "study")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "base-run.yaml").write_text(plan.base_config)
    for run in [r for r in plan.runs if r.stage == "grid"]:
        argv = shlex.split(train_command(plan, run))[6:]
        assert main([*argv[:argv.index("--device")], "--device", "cpu", *argv[argv.index("--device") + 2:]]) == 0
    steps, real_step = [], trainer.Trainer.optimizer_step
    monkeypatch.setattr(trainer.Trainer, "optimizer_step", lambda self: steps.append(1) or real_step(self))
    results = run_protocol(preset, "study", log=lambda *_: None)
    runs = sum(len(v["grid"]) + len(set(r["seed"] for r in v["runs"]) - {0}) for v in results["variants"])
    assert len(steps) == (runs - plan.count("grid")) * plan.steps  # the launched grid runs trained nothing more


def test_dry_run_prints_the_plan_and_creates_no_file(tmp_path, monkeypatch, capsys, gpu):
    _, plan = gpu
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path / "cache"))
    assert main(["compare", "--preset", "protocol_gpu", "--dry-run"]) == 0
    assert main(["compare", "--preset", "protocol_dense", "--dry-run", "--out", "elsewhere"]) == 0
    assert list(tmp_path.iterdir()) == []
    text = capsys.readouterr().out
    assert text.startswith("protocol plan: preset protocol_gpu: ")
    assert "standard               primary  123,588,864" in text
    assert "runs: 96 grid (8 variants x 6 rates x 2 seeds) + 96 final = 192; with every extension 224 runs" in text
    assert f"total: {plan.flops:.3g} training FLOPs" in text
    assert "torchrun --standalone --nproc-per-node 8 -m attnres train --config " \
           "reports/compare-protocol_gpu/base-run.yaml --device cuda" in text
    assert "protocol plan: preset protocol_dense: " in text and "elsewhere/base-run.yaml" in text


def test_dry_run_without_a_protocol_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--preset", "smoke", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == ("attnres compare: error: preset smoke has no 'protocol' section: --dry-run plans the "
                   "fair-comparison protocol (a preset with one, e.g. protocol_dense or protocol_gpu)\n")
    assert list(tmp_path.iterdir()) == []


def test_the_preset_states_its_settings():
    preset = load_preset("protocol_gpu")
    run = preset.run
    assert run["train"]["precision"] == "bf16" and run["train"]["parallel"] == "auto"
    assert (run["model"]["hidden_size"], run["model"]["num_layers"], run["model"]["num_heads"]) == (768, 12, 12)
    assert run["data"]["source"] == "fineweb-edu" and run["train"]["seq_len"] == 1024
    grid = preset.protocol.lr_grid
    assert all(math.isclose(b / a, math.sqrt(2), rel_tol=1e-3) for a, b in zip(grid, grid[1:]))  # half an octave
    assert grid[0] < 1e-3 and grid[-1] > 3e-3
    dense = load_preset("protocol_dense")
    assert preset.variants == dense.variants and preset.seeds == dense.seeds
    assert {**preset.protocol.to_dict(), "lr_grid": None} == {**dense.protocol.to_dict(), "lr_grid": None}
    assert yaml.safe_load(plan_protocol(preset).base_config) == run
