"""Checkpoints saved by attnres 0.2.0 load with today's code and compute what they did: the weights bit
for bit, the logits to rounding (recorded on this project's machine, compared on any CPU), and a model
saved again in today's form computes the same logits, bit for bit, as the one loaded from the old files.
tests/fixtures/v0_2_0/make.py made the files.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0_2_0"
NAMES = ("block_dense", "delta_block_kimi_layers", "full_kimi_default_layers")
# The same tolerance as tests/residual/test_legacy.py: another CPU or ATen kernel path rounds
# differently; losing a routing parameter or option moves the logits by far more.
RECORDED_RTOL, RECORDED_ATOL = 1e-5, 1e-6


@pytest.mark.recorded
@pytest.mark.parametrize("name", NAMES)
def test_a_0_2_0_checkpoint_loads_and_computes_what_it_did(name, tmp_path):
    from transformers import AutoModelForCausalLM

    import attnres.hf  # noqa: F401  (registers the Auto classes)

    recorded = load_file(str(FIXTURES / "logits.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / name).eval()
    state = model.state_dict()
    stored = load_file(str(FIXTURES / name / "model.safetensors"))
    assert set(stored) <= set(state)
    for key, tensor in stored.items():
        assert torch.equal(state[key], tensor), key
    with torch.no_grad():
        logits = model(recorded["input_ids"]).logits
        torch.testing.assert_close(logits, recorded[name], rtol=RECORDED_RTOL, atol=RECORDED_ATOL)
        model.save_pretrained(tmp_path)
        again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        assert torch.equal(again(recorded["input_ids"]).logits, logits)
    old = json.loads((FIXTURES / name / "config.json").read_text())
    new = json.loads((tmp_path / "config.json").read_text())
    for field in ("residual", "residual_options", "layer_types", "mla", "kda", "moe", "num_hidden_layers"):
        assert new.get(field) == old.get(field), field
