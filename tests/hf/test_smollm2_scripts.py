"""tools/benchmarks/smollm2_step0.py and smollm2_convert.py on a tiny Llama GGUF (no download, no corpus):
every variant converts and the result files carry their provenance."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from tests.hf.test_gguf import PROMPT, gguf_file  # noqa: E402,F401  (the tiny GGUF fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "benchmarks"))  # as when run as scripts
import smollm2_convert  # noqa: E402
import smollm2_step0  # noqa: E402

PROVENANCE = {"command", "created", "machine", "code_path", "settings"}


def batches(gguf, seq_len, sequences):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (1, seq_len), generator=generator) for _ in range(sequences)]


@pytest.fixture
def offline(monkeypatch):
    """Held-out text and chat prompts without the demo corpus or a chat template."""
    monkeypatch.setattr(smollm2_step0, "held_out_batches", batches)
    monkeypatch.setattr(smollm2_convert, "held_out_batches", batches)
    monkeypatch.setattr(smollm2_convert, "chat_ids", lambda tokenizer, question: PROMPT)


def by_key(rows):
    return {(row["key"], row.get("dtype")): row for row in rows}


def test_step0_writes_every_variant_with_provenance(tmp_path, gguf_file, offline):  # noqa: F811
    path = smollm2_step0.main(["--cache", str(gguf_file[0].parent), "--sequences", "2", "--seq-len", "16",
                               "--num-blocks", "2", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path == tmp_path / "step0.json" and PROVENANCE <= set(result)
    assert result["code_path"]["precision"] == "fp32" and result["settings"]["num_blocks"] == 2
    rows = {row["key"]: row for row in result["variants"]}
    assert list(rows) == smollm2_step0.KEYS
    assert rows["standard"]["vs_standard"] == 1.0
    assert rows["delta_block:gate"]["perplexity"] == rows["standard"]["perplexity"]  # exact by construction
    assert rows["delta_block"]["perplexity"] != rows["standard"]["perplexity"]  # plain Delta Block is not


def test_convert_writes_every_variant_and_the_eps_check(tmp_path, gguf_file, offline, capsys):  # noqa: F811
    path = smollm2_convert.main(["--cache", str(gguf_file[0].parent), "--sequences", "2", "--seq-len", "16",
                                 "--new-tokens", "4", "--num-blocks", "2", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path == tmp_path / "results.json" and PROVENANCE <= set(result)
    assert result["settings"]["new_tokens"] == 4 and len(result["source"]["answers"]) == 3
    rows = by_key(result["variants"])
    assert {key for key, _ in rows} == set(smollm2_step0.KEYS)
    assert rows[("standard", "bfloat16")]["max_abs_logit_diff"] is None  # a file size only
    for key in ("standard", "delta_block:gate"):
        row = rows[(key, "float32")]
        assert row["exact"] and row["max_abs_logit_diff"] == 0 and row["answers_equal"] == 3
        assert row["special_ids_equal"] and row["same_argmax_fraction"] == 1
    assert [row["norm_eps"] for row in result["eps_check"]] == pytest.approx([1e-5, 1e-12])
    assert "| delta_block (N=2) [gate] | True | True" in capsys.readouterr().out
