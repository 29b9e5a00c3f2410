"""`attnres convert` killed while writing its output: the --out directory appears whole or not at all, a
rerun into it succeeds and clears what the killed one left (tests/crash.py kills the child process at a
chosen write)."""

from pathlib import Path

import pytest
import torch

from tests.crash import Kill, assert_whole, non_atomic_writes, run_cli

transformers = pytest.importorskip("transformers")

import attnres.hf  # noqa: E402,F401  (registers the Auto classes)


def test_a_killed_convert_leaves_no_model_and_reruns(tmp_path):
    config = transformers.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    source = tmp_path / "source"
    transformers.Qwen3ForCausalLM(config).save_pretrained(source)
    (source / "tokenizer_config.json").write_text('{"eos_token": "x"}')
    reference_dir, out = tmp_path / "reference", tmp_path / "model"

    def convert(target, kill=None):
        return run_cli(["convert", str(source), "--residual", "block_attnres", "--option", "num_blocks=2",
                        "--out", str(target)], tmp_path, {}, kill)

    def leftovers():
        return sorted(p.name for p in tmp_path.glob(".model.*"))

    # uninterrupted: the directory is built under a temporary name and renamed into place, once
    reference = convert(reference_dir)
    assert reference.returncode == 0, reference.stderr
    assert non_atomic_writes(reference, tmp_path) == []
    into_place = [Path(event[2]).name for event in reference.events if event[:2] == ("rename", str(reference_dir))]
    assert len(into_place) == 1 and into_place[0].startswith(".reference."), into_place

    # 1. killed as the built directory was about to be renamed, its weights cut in half: no --out directory
    first = convert(out, Kill("rename", str(out)))
    assert first.killed, first.stderr
    killed_first = leftovers()
    assert not out.exists() and len(killed_first) == 1
    assert_whole(tmp_path)

    # 2. killed partway through building it (config and weights written, tokenizer not yet): the rerun
    #    cleared the first one's leftover, and leaves no --out directory either
    second = convert(out, Kill("open", f"{tmp_path}/.model.*/*tokenizer_config.json*"))
    assert second.killed, second.stderr
    assert not out.exists() and len(leftovers()) == 1 and leftovers() != killed_first
    assert_whole(tmp_path)

    # 3. the rerun converts into --out (nothing there refuses it), clears the leftovers, and writes what an
    #    uninterrupted conversion writes
    final = convert(out)
    assert final.returncode == 0, final.stderr
    assert leftovers() == []
    assert_whole(tmp_path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in reference_dir.iterdir()}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert loaded.config.residual == "block_attnres"
