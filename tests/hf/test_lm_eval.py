"""lm-evaluation-harness runs on an attnres model: a local `dataset_path: json` task, offline."""

import json
import random

import pytest

pytest.importorskip("lm_eval")

from attnres.cli import main  # noqa: E402
from attnres.data import train_bpe  # noqa: E402
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from tests.train.conftest import WORDS  # noqa: E402

TASK = """task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_lm_eval_produces_the_metric(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"the {w} is", "choices": ["light", "water", "stone"],
                                        "answer": i % 3}) + "\n" for i, w in enumerate(WORDS[:8])))
    (tasks / "tiny_choice.yaml").write_text(TASK.format(data=data))
    rng = random.Random(0)
    tokenizer = train_bpe([" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(20)], vocab_size=300)
    config = AttnResConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual="delta_block", num_blocks=2,
                           max_position_embeddings=128)
    model_dir = tmp_path / "model"
    AttnResForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save(model_dir)
    out = tmp_path / "results.json"
    code = main(["lm-eval", str(model_dir), "--tasks", "tiny_choice", "--include-path", str(tasks), "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert 0.0 <= results["tiny_choice"]["acc,none"] <= 1.0
    assert results["tiny_choice"]["sample_len"] == 8
