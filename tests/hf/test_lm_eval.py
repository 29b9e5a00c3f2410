"""lm-evaluation-harness runs on an attnres model: local `dataset_path: json` tasks, offline.

lm-eval's Hugging Face backend batches in two ways: loglikelihood requests (multiple choice) are
right-padded and sent without a mask (causal attention keeps real tokens clean), generate_until
requests are left-padded and sent to `generate` with an attention_mask. Both must score the same
at batch size 4 as at batch size 1.
"""

import json
import random

import pytest

pytest.importorskip("lm_eval")

from lm_eval.models.huggingface import HFLM  # noqa: E402

from attnres.cli import main  # noqa: E402
from attnres.data import train_bpe  # noqa: E402
from attnres.hf import AttnResConfig, AttnResForCausalLM  # noqa: E402
from tests.helpers import activate_routing  # noqa: E402
from tests.train.conftest import WORDS  # noqa: E402

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{question}}}}"
"""

CHOICE_TASK = """output_type: multiple_choice
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

GENERATE_TASK = """output_type: generate_until
doc_to_target: "{{continuation}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 5
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

# Choices of one to six words, so their token counts differ within every batch of four.
CHOICES = ["light", "deep water", "a grey old stone", "the long road home at night", "fire", "bread and salt"]
NUM_DOCS = 8


def questions():
    """Prompts of different token lengths: a lead word and zero to three more clauses."""
    return [f"the {w} is" + " and the house" * (i % 4) for i, w in enumerate(WORDS[:NUM_DOCS])]


def write_tasks(tmp_path, continuations):
    """Both task YAMLs and their data under tmp_path/tasks; `continuations` are the generation targets."""
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    choice_data, generate_data = tmp_path / "choice.jsonl", tmp_path / "generate.jsonl"
    choice_data.write_text("".join(
        json.dumps({"question": q, "choices": CHOICES[i % 3:i % 3 + 4], "answer": i % 4}) + "\n"
        for i, q in enumerate(questions())))
    generate_data.write_text("".join(json.dumps({"question": q, "continuation": continuations.get(q, "")}) + "\n"
                                     for q in questions()))
    (tasks / "tiny_choice.yaml").write_text(TASK.format(name="tiny_choice", data=choice_data) + CHOICE_TASK)
    (tasks / "tiny_generate.yaml").write_text(TASK.format(name="tiny_generate", data=generate_data) + GENERATE_TASK)
    return tasks


def tiny_model_dir(tmp_path):
    rng = random.Random(0)
    tokenizer = train_bpe([" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(20)], vocab_size=300)
    config = AttnResConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=48, residual="delta_block",
                           residual_options={"num_blocks": 2}, max_position_embeddings=128)
    model = AttnResForCausalLM(config)
    activate_routing(model.model.routers)  # non-uniform routing, so routing over padded rows would show
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save(model_dir)
    return model_dir


@pytest.fixture
def recorded(monkeypatch):
    """What each lm-eval run did: the batches the model saw and the text generate_until returned."""
    record = {"batches": [], "generated": {}}
    forward = AttnResForCausalLM.forward

    def recording_forward(self, input_ids=None, attention_mask=None, **kwargs):
        # Rows of different lengths: by the mask where one is sent, else by lm-eval's right padding
        # with id 0 (the tokenizer's EOS, never inside a prompt here).
        real = attention_mask if attention_mask is not None else input_ids != 0
        padded = len(set(real.sum(1).tolist())) > 1
        record["batches"].append((input_ids.shape[0], padded, kwargs.get("cache") is not None))
        return forward(self, input_ids, attention_mask=attention_mask, **kwargs)

    generate_until = HFLM.generate_until

    def recording_generate_until(self, requests, disable_tqdm=False):
        texts = generate_until(self, requests, disable_tqdm)
        record["generated"].update((request.args[0], text) for request, text in zip(requests, texts))
        return texts

    monkeypatch.setattr(AttnResForCausalLM, "forward", recording_forward)
    monkeypatch.setattr(HFLM, "generate_until", recording_generate_until)
    return record


def run(model_dir, tasks, out, batch_size):
    code = main(["lm-eval", str(model_dir), "--tasks", "tiny_choice,tiny_generate", "--include-path", str(tasks),
                 "--batch-size", str(batch_size), "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_lm_eval_scores_equal_at_batch_size_1_and_4(tmp_path, recorded):
    """Batch size 1 first: its generations become the generation task's targets. At batch size 4 the
    model sees padded batches of both kinds, and both tasks score exactly as at batch size 1
    (exact_match 1.0: every batched, left-padded generation equals the one made alone)."""
    model_dir = tiny_model_dir(tmp_path)
    single = run(model_dir, write_tasks(tmp_path, {}), tmp_path / "single.json", batch_size=1)
    assert {b for b, _, _ in recorded["batches"]} == {1}
    choice = single["tiny_choice"]
    # lm-eval 0.4.13 says how many documents it scored; 0.4.10 (the floor) does not, and its accuracy is
    # then at least a mean over NUM_DOCS documents' 0 or 1
    assert 0.0 <= choice["acc,none"] <= 1.0 and choice.get("sample_len", NUM_DOCS) == NUM_DOCS
    assert choice["acc,none"] * NUM_DOCS == pytest.approx(round(choice["acc,none"] * NUM_DOCS), abs=1e-9)
    alone = dict(recorded["generated"])
    assert len(alone) == NUM_DOCS and any(alone.values())  # something was generated for every prompt

    recorded["batches"].clear()
    batched = run(model_dir, write_tasks(tmp_path, alone), tmp_path / "batched.json", batch_size=4)
    assert recorded["generated"] == alone
    assert batched["tiny_generate"]["exact_match,none"] == 1.0
    assert batched["tiny_choice"]["acc,none"] == single["tiny_choice"]["acc,none"]
    scored = [(b, padded) for b, padded, cached in recorded["batches"] if not cached]
    prefills = [(b, padded) for b, padded, cached in recorded["batches"] if cached]
    assert any(padded for _, padded in scored)  # loglikelihood: rows of different lengths, right-padded
    assert any(padded for _, padded in prefills)  # generate_until: left-padded prompts with a mask


def test_the_request_is_checked_before_the_model_loads(tmp_path):
    from attnres.common.errors import InputError
    from attnres.hf.lm_eval import PAPER_TASKS, check_lm_eval_options, parse_tasks

    assert parse_tasks("paper") == list(PAPER_TASKS) and parse_tasks(" piqa, arc_easy ,") == ["piqa", "arc_easy"]
    with pytest.raises(InputError, match=r"--tasks must name lm-eval tasks"):
        parse_tasks(" , ")
    check_lm_eval_options(1, None, tmp_path, tmp_path / "results.json")
    with pytest.raises(InputError, match=r"--include-path \S+ is not a folder"):
        check_lm_eval_options(1, None, tmp_path / "absent", None)
    with pytest.raises(InputError, match=r"--out \S+: give a file path in an existing folder"):
        check_lm_eval_options(1, 5, None, tmp_path)
    (tmp_path / "earlier.json").write_text("{}")  # an earlier result, or a file of the user's: kept unless forced
    with pytest.raises(InputError, match=r"--out \S+earlier\.json exists; give a new file path, or pass --force"):
        check_lm_eval_options(1, None, None, tmp_path / "earlier.json")
    check_lm_eval_options(1, None, None, tmp_path / "earlier.json", force=True)
