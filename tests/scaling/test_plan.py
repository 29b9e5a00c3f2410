"""The sweep's plan: tokens by the rule, FLOPs by the accounting, shards balanced, the dry run's table."""

import math

import pytest

from attnres.cli import main
from attnres.model.flops import parameter_count, training_flops
from attnres.scaling.plan import assign_shards, plan_sweep, plan_text
from attnres.scaling.preset import ScalingPresetError, load_preset
from tests.scaling.test_preset import BASE, write


@pytest.fixture
def preset(tmp_path):
    return load_preset(write(tmp_path, BASE))


def test_every_size_seed_and_variant_is_planned(preset, tmp_path):
    planned = plan_sweep(preset, tmp_path)
    keys = [(p.size, p.seed, p.name) for p in planned]
    assert keys == [("d16-l2", 0, "standard"), ("d16-l2", 0, "block_attnres (N=2)"),
                    ("d16-l2", 1, "standard"), ("d16-l2", 1, "block_attnres (N=2)"),
                    ("d32-l2", 0, "standard"), ("d32-l2", 0, "block_attnres (N=2)")]
    assert len({p.run.out_dir for p in planned}) == len(planned)


def test_tokens_follow_the_rule_and_are_shared_by_the_variants_of_a_size(preset, tmp_path):
    planned = plan_sweep(preset, tmp_path)
    for size in ("d16-l2", "d32-l2"):
        runs = [p for p in planned if p.size == size]
        standard = next(p for p in runs if p.variant["residual"] == "standard")
        per_step = standard.run.train.tokens_per_step  # 2 x 32
        wanted = preset.rules.tokens_per_parameter * standard.parameters
        assert standard.tokens == per_step * math.ceil(wanted / per_step)
        assert {p.tokens for p in runs} == {standard.tokens}
        assert {p.run.train.steps for p in runs} == {standard.run.train.steps}


def test_flops_and_parameters_are_each_variants_own(preset, tmp_path):
    for p in plan_sweep(preset, tmp_path):
        config = p.run.model.with_vocab_size(300)
        assert p.flops == training_flops(config, p.tokens, p.run.train.seq_len)
        assert p.parameters == parameter_count(config).non_embedding
    block = [p for p in plan_sweep(preset, tmp_path) if p.variant["residual"] != "standard"]
    standard = [p for p in plan_sweep(preset, tmp_path) if p.variant["residual"] == "standard"]
    assert all(b.flops > s.flops for b, s in zip(block, standard))  # routing is charged


def test_parameter_count_excludes_the_embedding_and_an_untied_head(preset, tmp_path):
    config = plan_sweep(preset, tmp_path)[0].run.model.with_vocab_size(300)
    tied = parameter_count(config)
    assert tied.total - tied.non_embedding == 300 * config.hidden_size
    untied = parameter_count(type(config).from_dict({**config.to_dict(), "tie_embeddings": False}))
    assert untied.non_embedding == tied.non_embedding
    assert untied.total - untied.non_embedding == 2 * 300 * config.hidden_size


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shards_cover_every_run_once_and_balance_flops(preset, tmp_path, count):
    shares = [[p.run.out_dir for p in plan_sweep(preset, tmp_path, shard=(i, count)) if p.mine] for i in range(count)]
    every = [p.run.out_dir for p in plan_sweep(preset, tmp_path)]
    assert sorted(sum(shares, [])) == sorted(every)
    planned = plan_sweep(preset, tmp_path)
    flops = {p.run.out_dir: p.flops for p in planned}
    loads = [sum(flops[r] for r in share) for share in shares]
    assert max(loads) - min(loads) <= max(flops.values())  # longest-first greedy: off by at most one run


def test_shard_must_be_valid(preset, tmp_path):
    with pytest.raises(ValueError, match="shard"):
        assign_shards(plan_sweep(preset, tmp_path), (2, 2))


def test_pretrained_tokenizer_needs_a_stated_vocabulary(tmp_path):
    values = {**BASE, "run": {**BASE["run"], "data": {"source": "demo", "tokenizer": str(tmp_path)}}}
    with pytest.raises(ScalingPresetError, match="vocab_size must be set"):
        plan_sweep(load_preset(write(tmp_path, values)), tmp_path)


def test_paper_dry_run_prints_the_plan_and_gpu_hours(capsys):
    assert main(["scaling", "--preset", "paper", "--dry-run"]) == 0
    text = capsys.readouterr().out
    preset = load_preset("paper")
    planned = plan_sweep(preset, "unused")
    for size in ("d768-l12", "d1024-l24", "d1280-l36", "d2560-l36", "d4096-l36"):
        assert size in text
    assert f"{len(planned)} runs (5 sizes x 5 variants x seeds)" in text
    total = sum(p.flops for p in planned)
    hours = total / (preset.gpu.peak_tflops * 1e12 * preset.gpu.mfu) / 3600
    assert f"all: {hours:,.0f} GPU-hours" in text
    # 20 tokens per non-embedding parameter at the largest size, in whole steps of 262,144 tokens
    largest = max(planned, key=lambda p: p.flops)
    assert largest.tokens >= 20 * largest.parameters * 0.99 and largest.tokens % 262_144 == 0


def test_dry_run_trains_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["scaling", "--preset", "tiny", "--dry-run", "--out", str(out)]) == 0
    assert "d48-l4" in capsys.readouterr().out
    assert not out.exists()


def test_cli_refuses_bad_input_by_name(capsys):
    assert main(["scaling", "--preset", "tiny", "--variants", "block_attnres", "--dry-run"]) == 2
    assert "--variants must include standard" in capsys.readouterr().err
    assert main(["scaling", "--preset", "tiny", "--set", "rules.head_dim=0", "--dry-run"]) == 2
    assert "rules.head_dim must be a positive integer" in capsys.readouterr().err
    assert main(["scaling", "--preset", "tiny", "--shard", "2/2"]) == 2
    assert "attnres scaling: error: --shard must be I/N with 0 <= I < N, e.g. 0/2; got '2/2'" in capsys.readouterr().err
