"""Configs written before variant options were typed still load (`attnres.residual.legacy`).

tests/fixtures/legacy holds Hugging Face directories and a run config made by attnres at commit
8a51afa (tests/fixtures/legacy/make.py), with flat option fields and routing_impl in the model.
"""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attnres import ConfigError, ModelConfig
from attnres.residual.legacy import upgrade_model_fields
from attnres.train import RunConfig, RunConfigError
from attnres.train.trainer import check_compatible

LEGACY = Path(__file__).parents[1] / "fixtures" / "legacy"
# The recorded logits (fp32, |logit| < 0.4) against today's, computed on another CPU or kernel path,
# which rounds differently: at most 4.8e-7 apart on an AMD EPYC with ATen's AVX2 and DEFAULT kernels
# (the recording machine was an Intel Xeon, AVX-512). Zeroing one model's routing parameters moves its
# logits by 9e-4 to 0.35, far outside this tolerance.
RECORDED_RTOL, RECORDED_ATOL = 1e-5, 1e-6
# What each old directory's options are today (every option, defaults resolved).
OPTIONS = {
    "block_input_query": {"query": "input_dependent", "weights": "softmax", "key_norm": True, "num_blocks": 2},
    "delta_block_gate": {"query": "static", "weights": "softmax", "key_norm": True, "num_blocks": 2,
                         "exact_conversion": "gate"},
    "full_lean_chunked": {"query": "static", "weights": "softmax", "key_norm": True},
    "denseformer_2x1": {"dilation": 2, "period": 1},
    "hyper_static": {"streams": 2, "dynamic": False},
    "mhc_5": {"streams": 4, "sinkhorn_iters": 5},
}


@pytest.mark.recorded
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_an_old_directory_loads_and_computes_what_it_did(name, tmp_path):
    from transformers import AutoModelForCausalLM

    import attnres.hf  # noqa: F401  (registers the Auto classes)

    recorded = load_file(str(LEGACY / "logits.safetensors"))
    ids = recorded["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(LEGACY / name).eval()
    assert model.config.residual_options == OPTIONS[name]
    stored = load_file(str(LEGACY / name / "model.safetensors"))
    state = model.state_dict()
    for key, tensor in stored.items():  # reading a file is exact: every weight as stored, bit for bit
        assert torch.equal(state[key], tensor), key
    old = json.loads((LEGACY / name / "config.json").read_text())
    with torch.no_grad():
        # How the old model computed routing is not kept ("auto" now). The logits were recorded on
        # another CPU, so they are compared to rounding, whichever implementation computes them.
        today = model(ids).logits
        torch.testing.assert_close(today, recorded[name], rtol=RECORDED_RTOL, atol=RECORDED_ATOL)
        model.set_routing(old["routing_impl"], old["routing_chunk_size"])
        as_before = model(ids).logits
        torch.testing.assert_close(as_before, recorded[name], rtol=RECORDED_RTOL, atol=RECORDED_ATOL)
        model.save_pretrained(tmp_path)  # saved again, in today's form only
        again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        again.set_routing(old["routing_impl"], old["routing_chunk_size"])
        # Both computed here, by one implementation: the model saved in today's form is the same
        # model, bit for bit.
        assert torch.equal(again(ids).logits, as_before)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["residual_options"] == OPTIONS[name]
    assert not {"num_blocks", "router_query", "hc_streams", "routing_impl", "routing_chunk_size"} & set(saved)


def test_an_old_config_json_reads_as_todays_model_config():
    old = json.loads((LEGACY / "full_lean_chunked" / "config.json").read_text())
    assert old["routing_impl"] == "lean" and old["routing_chunk_size"] == 2  # how to compute: not kept
    config = ModelConfig.from_hf_dict(old)
    assert config == ModelConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                 intermediate_size=32, max_seq_len=16, residual="full_attnres")


def test_an_old_run_config_resumes_with_another_routing_implementation():
    saved = yaml.safe_load((LEGACY / "run.yaml").read_text())
    assert saved["model"]["routing_impl"] == "reference" and saved["model"]["router_query"] == "input_dependent"
    run = RunConfig.from_dict(saved)
    assert (run.model.residual_options.num_blocks, run.model.residual_options.query) == (2, "input_dependent")
    assert not hasattr(run.model, "routing_impl") and run.train.routing_impl == "reference"  # the old value, as a default
    switched = RunConfig.from_dict({**saved, "train": {**saved["train"], "routing_impl": "auto"}})
    check_compatible(saved, switched)  # the same model: a resume may compute routing another way
    with pytest.raises(RunConfigError, match=r"train.routing_impl='lean': residual='block_attnres' with .* computes "
                                             r"with the reference code .*allowed values: \['auto', 'reference'\]"):
        RunConfig.from_dict({**saved, "train": {**saved["train"], "routing_impl": "lean"}})


def test_old_fields_at_their_unset_value_are_dropped_and_set_ones_are_checked():
    old = {"residual": "standard", "num_blocks": None, "exact_conversion": None, "router_query": "static",
           "router_weights": "softmax", "router_key_norm": True, "denseformer_dilation": 1, "denseformer_period": 1,
           "hc_streams": None, "hc_dynamic": None, "hc_sinkhorn_iters": None, "routing_impl": "fused",
           "routing_chunk_size": None}
    assert upgrade_model_fields(old) == ({"residual": "standard"}, {"routing_impl": "fused"})
    assert upgrade_model_fields({**old, "residual": "hyper_connections", "hc_streams": 2}) == \
        ({"residual": "hyper_connections", "residual_options": {"streams": 2}}, {"routing_impl": "fused"})
    with pytest.raises(ConfigError, match=r"ModelConfig.router_weights applies only to residual in \['full_attnres', "
                                          r"'block_attnres', 'delta_attnres', 'delta_block'\]; leave it unset for "
                                          r"residual='standard' \(got 'sigmoid'\)"):
        ModelConfig.from_dict({"vocab_size": 32, "hidden_size": 16, "num_layers": 2, "num_heads": 2,
                               "num_kv_heads": 1, "intermediate_size": 32, **old, "router_weights": "sigmoid"})
    with pytest.raises(ConfigError, match=r"ModelConfig.num_blocks=4 contradicts "
                                          r"ModelConfig.residual_options.num_blocks=2"):
        ModelConfig.from_dict({"vocab_size": 32, "hidden_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                               "intermediate_size": 32, "residual": "block_attnres", "num_blocks": 4,
                               "residual_options": {"num_blocks": 2}})
