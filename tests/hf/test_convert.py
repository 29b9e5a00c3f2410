"""Checkpoint conversion against models that transformers itself builds and saves to disk.

Every family (Qwen3, Qwen2, Llama, Mistral) is instantiated by transformers with random weights,
saved with `save_pretrained`, converted from disk, and compared with transformers' own logits.
"""

import copy
import json

import pytest
import torch

from attnres.hf.convert import (ConversionError, convert_checkpoint, convert_state_dict, model_config_from_hf,
                                read_hf_checkpoint)
from tests.helpers import options_of

transformers = pytest.importorskip("transformers")

FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
SHAPE = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64)
# The variants that reproduce the standard model at zero queries (method §4).
EXACT_VARIANTS = [("full_attnres", None, None), ("block_attnres", 2, None), ("delta_attnres", None, None),
                  ("delta_block", 2, "gate"), ("delta_block", 2, "partial"), ("denseformer", None, None),
                  ("hyper_connections", None, None)]  # mHC draws its projections: not function-preserving


def hf_config(family, tie=False, **overrides):
    """A tiny transformers config of `family` (eager attention; RoPE theta 10000)."""
    values = dict(SHAPE, tie_word_embeddings=tie, initializer_range=0.2,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if family == "qwen3":
        cls, values["head_dim"] = transformers.Qwen3Config, 16  # not hidden/heads: head_dim must be read
    elif family == "qwen2":
        cls = transformers.Qwen2Config
    elif family == "llama":
        cls = transformers.LlamaConfig
    else:
        # A window as long as the model's maximum never clips: Mistral converts.
        cls, values["sliding_window"] = transformers.MistralConfig, SHAPE["max_position_embeddings"]
    return cls(**{**values, **overrides})


def save_hf_model(family, directory, tie=False, **save_kwargs):
    """transformers' model of `family` with non-trivial weights, saved to `directory`; returns it (eval)."""
    config = hf_config(family, tie)
    config._attn_implementation = "eager"
    torch.manual_seed(FAMILIES.index(family) + 10 * tie)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # gains away from 1 so a misplaced gain shows
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "bias" in name:  # Qwen2's q/k/v biases away from 0
                p.copy_(0.3 * torch.randn_like(p))
        # Embedding std 2 (weights std 0.2): activations of realistic size, so RMSNorm's eps (1e-6)
        # cannot hide a wrong scale, and the routed variants' uniform averages (x / n) stay far above it.
        model.model.embed_tokens.weight.mul_(10.0)
        if tie:  # the head is the embedding: keep the logits' scale (std ~1) like the untied models'
            model.model.norm.weight.mul_(0.1)
    model.save_pretrained(directory, **save_kwargs)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(family, tie): (directory, transformers model)}, built once for the module."""
    out = {}
    for family in FAMILIES:
        for tie in (False, True):
            directory = tmp_path_factory.mktemp(f"{family}-{'tied' if tie else 'untied'}")
            out[family, tie] = directory, save_hf_model(family, directory, tie)
    return out


IDS = torch.randint(0, SHAPE["vocab_size"], (2, 13), generator=torch.Generator().manual_seed(1))


def logits(model):
    with torch.no_grad():
        out = model(input_ids=IDS) if isinstance(model, transformers.PreTrainedModel) else model(IDS)
    return out.logits


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_standard_conversion_equals_transformers(checkpoints, family, tie):
    # Measured max |logit difference| (logits std 1.1-1.3): 1.2e-6 to 2.1e-6 across families and ties.
    directory, hf = checkpoints[family, tie]
    model = convert_checkpoint(directory)
    assert not model.training and model.config.residual == "standard"
    assert model.config.tie_embeddings == tie and model.config.qk_norm == (family == "qwen3")
    assert model.config.attention_bias == (family == "qwen2")
    assert (model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()) == tie
    torch.testing.assert_close(logits(model), logits(hf), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("residual, num_blocks, exact", EXACT_VARIANTS,
                         ids=["full", "block", "delta", "delta_block-gate", "delta_block-partial", "denseformer",
                              "hyper_connections"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_function_preserving_variants_equal_transformers(checkpoints, family, tie, residual, num_blocks, exact):
    # Measured max |logit difference| (logits std 1.1-1.3), over families and ties: full_attnres
    # 1.4e-5 to 2.9e-5 (its sub-layer and final inputs are x / n with n up to 7, where eps and
    # rounding weigh most), block_attnres 3.4e-6 to 7.9e-6, delta_attnres 1.8e-6 to 2.5e-6,
    # delta_block gate 1.2e-6 to 2.1e-6 (= standard), partial 1.7e-6 to 2.9e-6. The tolerance is 3x
    # the largest. With transformers' default init (std 0.02) full_attnres differs by 2e-2: eps.
    directory, hf = checkpoints[family, tie]
    model = convert_checkpoint(directory, residual=residual,
                               residual_options=options_of(num_blocks=num_blocks, exact_conversion=exact))
    assert model.config.residual == residual and len(model.routers) > 0
    # every mixer at its method's start (zero queries; DenseFormer's averages at the identity on the
    # current layer's output; the stream mixers' initialisation, method §7.3)
    for router in model.routers:
        fresh = copy.deepcopy(router)
        fresh.reset_parameters()
        assert all(torch.equal(a, b) for a, b in zip(router.state_dict().values(), fresh.state_dict().values()))
    torch.testing.assert_close(logits(model), logits(hf), rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_delta_block_is_not_function_preserving(checkpoints, family):
    # Measured max |logit difference|: 1.2 to 2.2 (versus <= 3e-6 with an exact_conversion option).
    directory, hf = checkpoints[family, False]
    model = convert_checkpoint(directory, residual="delta_block", residual_options={"num_blocks": 2})
    assert (logits(model) - logits(hf)).abs().max() > 0.1


def test_sharded_safetensors_convert_the_same(tmp_path, checkpoints):
    hf = save_hf_model("qwen2", tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    config, state = read_hf_checkpoint(tmp_path)
    assert config["model_type"] == "qwen2" and set(state) == set(hf.state_dict())
    single = convert_checkpoint(checkpoints["qwen2", False][0], residual="block_attnres",
                                residual_options={"num_blocks": 3})
    sharded = convert_checkpoint(tmp_path, residual="block_attnres", residual_options={"num_blocks": 3})
    torch.testing.assert_close(logits(sharded), logits(single), rtol=0, atol=0)
    torch.testing.assert_close(logits(convert_checkpoint(tmp_path)), logits(hf), rtol=1e-5, atol=1e-5)


def test_pytorch_model_bin_loads_with_weights_only(tmp_path, checkpoints):
    directory, hf = checkpoints["llama", True]
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    torch.testing.assert_close(logits(convert_checkpoint(tmp_path)), logits(hf), rtol=1e-5, atol=1e-5)
    # A pickle holding anything but tensors and containers is not unpickled.
    torch.save({"model.norm.weight": torch.ones(32), "hook": ConversionError("not a tensor")},
               tmp_path / "pytorch_model.bin")
    with pytest.raises(ConversionError, match=r"pytorch_model.bin with torch.load\(weights_only=True\)"):
        convert_checkpoint(tmp_path)


def test_read_returns_the_config_and_the_raw_state(checkpoints):
    directory, hf = checkpoints["qwen3", True]
    config, state = read_hf_checkpoint(str(directory))
    assert config == json.loads((directory / "config.json").read_text())
    expected = hf.state_dict()
    assert set(state) <= set(expected) and "model.embed_tokens.weight" in state
    for name, tensor in state.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_bfloat16_conversion(checkpoints):
    directory, hf = checkpoints["qwen3", False]
    model = convert_checkpoint(directory, residual="delta_block",
                               residual_options={"num_blocks": 2, "exact_conversion": "gate"}, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored after building in bf16
    # bf16 weights and activations against the fp32 reference (measured max difference 0.053, logits std 1.2).
    assert (logits(model).float() - logits(hf)).abs().max() < 0.3


# ---------------------------------------------------------------------------------------------
# Config mapping


@pytest.mark.parametrize("family", FAMILIES)
def test_sparse_configs_take_transformers_class_defaults(family):
    """A config.json with only the shape keys (and a legacy top-level rope_theta for Llama): every
    default we fill in equals what transformers' own config class fills in."""
    raw = {"model_type": family, "vocab_size": 100, "hidden_size": 256, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 32}
    if family == "llama":
        raw["rope_theta"] = 500000.0
    if family == "mistral":
        raw["sliding_window"] = None
    theirs = transformers.AutoConfig.for_model(**raw)
    ours = model_config_from_hf(raw)
    assert ours.num_kv_heads == theirs.num_key_value_heads
    assert ours.head_dim == getattr(theirs, "head_dim", 256 // 32)
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == (500000.0 if family == "llama" else 10000.0)
    assert ours.tie_embeddings is theirs.tie_word_embeddings is False
    assert ours.norm_eps == theirs.rms_norm_eps and ours.max_seq_len == theirs.max_position_embeddings
    assert model_config_from_hf(raw, max_seq_len=128).max_seq_len == 128


def test_model_config_fields_and_variant_arguments():
    raw = hf_config("qwen3", tie=True).to_dict()
    config = model_config_from_hf(raw, residual="delta_block",
                                  residual_options={"num_blocks": 3, "exact_conversion": "partial"})
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size) == (100, 32, 3, 4, 2, 16, 48)
    options = config.residual_options
    assert (config.residual, options.num_blocks, options.exact_conversion) == ("delta_block", 3, "partial")
    assert config.tie_embeddings and config.qk_norm and not config.attention_bias and config.max_seq_len == 64
    with pytest.raises(ConversionError, match=r"num_blocks=4 gives blocks of 2 sub-layers.*allowed values"):
        model_config_from_hf(raw, residual="block_attnres", residual_options={"num_blocks": 4})


def write_config(directory, config):
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(config, dict):
        (directory / "config.json").write_text(json.dumps(config))
    else:
        config.to_json_file(directory / "config.json")
    return directory


def test_refuses_mixture_of_experts(tmp_path):
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4)
    with pytest.raises(ConversionError, match=r"model_type='mixtral': mixture-of-experts MLPs "
                                              r"\(num_local_experts=4\) are not supported"):
        convert_checkpoint(write_config(tmp_path, config))
    with pytest.raises(ConversionError, match=r"mixture-of-experts MLPs \(num_experts=8\)"):
        model_config_from_hf({**hf_config("qwen3").to_dict(), "model_type": "qwen3_moe", "num_experts": 8})


def test_refuses_other_architectures(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100)
    with pytest.raises(ConversionError, match=r"unsupported model_type 'gpt2' \(LayerNorm with biases, learned "
                                              r"absolute position embeddings.*\); supported model types: "
                                              r"\['llama', 'mistral', 'qwen2', 'qwen3', 'kimi_linear'\]"):
        convert_checkpoint(write_config(tmp_path, config))
    with pytest.raises(ConversionError, match=r"unsupported model_type 'gptj' \(parallel attention and MLP"):
        model_config_from_hf({"model_type": "gptj"})
    with pytest.raises(ConversionError, match="config.json has no model_type"):
        model_config_from_hf({"hidden_size": 32})


def test_sliding_window_refused_where_it_clips(tmp_path):
    config = hf_config("mistral", sliding_window=16)
    with pytest.raises(ConversionError, match=r"mistral: sliding-window attention \(sliding_window=16 on all 3 "
                                              r"layers\) is not supported.*max_seq_len=64"):
        convert_checkpoint(write_config(tmp_path, config))
    # Up to the window's length the model is full causal attention: it converts.
    assert model_config_from_hf(config.to_dict(), max_seq_len=16).max_seq_len == 16
    qwen = hf_config("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1).to_dict()
    with pytest.raises(ConversionError, match=r"qwen2: sliding-window attention \(sliding_window=16 on layers "
                                              r"1, 2\)"):
        model_config_from_hf(qwen)
    # A Qwen config that only mentions a window (use_sliding_window false) is full attention.
    model_config_from_hf({**hf_config("qwen3").to_dict(), "sliding_window": 16, "layer_types": None})
    with pytest.raises(ConversionError, match=r"layer_types \['linear_attention'\] are not supported"):
        model_config_from_hf({**hf_config("qwen3").to_dict(), "layer_types": ["linear_attention"] * 3})
    with pytest.raises(ConversionError, match=r"qwen3: config\.json layer_types must be a list of strings"):
        model_config_from_hf({**hf_config("qwen3").to_dict(), "layer_types": 3})  # was a TypeError
    marked = ["full_attention", "sliding_attention", "full_attention"]
    with pytest.raises(ConversionError, match=r"llama: layer_types marks layers 1 as 'sliding_attention'"):
        model_config_from_hf({**hf_config("llama").to_dict(), "layer_types": marked})


def test_refuses_rope_scaling(tmp_path):
    config = hf_config("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    with pytest.raises(ConversionError, match=r"llama: RoPE scaling rope_parameters.rope_type='llama3' is not "
                                              r"supported"):
        convert_checkpoint(write_config(tmp_path, config))
    legacy = {**hf_config("llama").to_dict(), "rope_scaling": {"type": "linear", "factor": 2.0}}
    with pytest.raises(ConversionError, match=r"RoPE scaling rope_scaling.rope_type='linear'"):
        model_config_from_hf(legacy)
    partial = {**hf_config("llama").to_dict(), "partial_rotary_factor": 0.5}
    with pytest.raises(ConversionError, match=r"partial rotary embedding \(partial_rotary_factor=0.5\)"):
        model_config_from_hf(partial)


@pytest.mark.parametrize("family, overrides, message", [
    ("llama", dict(hidden_act="gelu"), r"llama: hidden_act='gelu' is not supported"),
    ("qwen3", dict(hidden_act="relu"), r"qwen3: hidden_act='relu' is not supported"),
    ("llama", dict(attention_bias=True), r"llama: attention_bias=True \(a bias on o_proj"),
    ("qwen3", dict(attention_bias=True), r"qwen3: attention_bias=True \(a bias on o_proj"),
    ("llama", dict(mlp_bias=True), r"llama: mlp_bias=True"),
])
def test_refuses_unsupported_features(tmp_path, family, overrides, message):
    with pytest.raises(ConversionError, match=message):
        convert_checkpoint(write_config(tmp_path, hf_config(family, **overrides)))


def test_mistral_attention_bias_flag_is_refused():
    with pytest.raises(ConversionError, match=r"mistral: attention_bias=True"):
        model_config_from_hf({**hf_config("mistral").to_dict(), "attention_bias": True})


# ---------------------------------------------------------------------------------------------
# Broken checkpoints


def test_missing_directory_config_and_weights(tmp_path):
    with pytest.raises(ConversionError, match=r"checkpoint directory '.*nowhere' does not exist"):
        convert_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ConversionError, match=r"checkpoint directory '.*nowhere' does not exist"):
        read_hf_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ConversionError, match=r"checkpoint: \S*config\.json does not exist"):
        read_hf_checkpoint(tmp_path)
    write_config(tmp_path, hf_config("llama"))
    with pytest.raises(ConversionError, match=r"has no weight files \(model.safetensors"):
        convert_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConversionError, match=r"checkpoint: \S*config\.json is not valid JSON"):
        read_hf_checkpoint(tmp_path)


def test_truncated_safetensors_is_refused(tmp_path):
    save_hf_model("llama", tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for call in (convert_checkpoint, read_hf_checkpoint):
        with pytest.raises(ConversionError, match=r"cannot read .*model.safetensors \(corrupt or truncated"):
            call(tmp_path)


def test_missing_shard_is_refused(tmp_path):
    save_hf_model("llama", tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ConversionError, match=rf"names shard '{shard.name}', which is missing"):
        convert_checkpoint(tmp_path)


def test_config_with_more_layers_than_the_weights_names_the_missing_tensors(tmp_path):
    save_hf_model("llama", tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 4}))
    for call in (convert_checkpoint, read_hf_checkpoint):
        with pytest.raises(ConversionError, match=r"missing tensors: model.layers.3.input_layernorm.weight, .*"
                                                  r"model.layers.3.mlp.down_proj.weight$"):
            call(tmp_path)


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    save_hf_model("qwen3", tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "intermediate_size": 40}))
    with pytest.raises(ConversionError, match=r"shape mismatches: model.layers.0.mlp.gate_proj.weight: expected "
                                              r"shape \(40, 32\) from the config, found \(48, 32\)"):
        convert_checkpoint(tmp_path)


def test_convert_state_dict_names_extras_and_checks_ties(checkpoints):
    _, hf = checkpoints["llama", False]
    config = model_config_from_hf(hf.config.to_dict())
    state = dict(hf.state_dict())
    converted = convert_state_dict(state, config)
    assert "lm_head.weight" in converted and not any(k.startswith(("model.", "residual.")) for k in converted)
    # Older checkpoints saved the RoPE table: ignored, it is recomputed.
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    assert convert_state_dict(state, config).keys() == converted.keys()
    with pytest.raises(ConversionError, match=r"tensors the config does not describe: "
                                              r"model.layers.0.self_attn.o_proj.bias"):
        convert_state_dict({**state, "model.layers.0.self_attn.o_proj.bias": torch.zeros(32)}, config)
    tied = model_config_from_hf({**hf.config.to_dict(), "tie_word_embeddings": True})
    with pytest.raises(ConversionError, match=r"tie_word_embeddings is true but the checkpoint's lm_head.weight "
                                              r"differs from model.embed_tokens.weight"):
        convert_state_dict(state, tied)
    same = {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}
    assert convert_state_dict(same, tied)["lm_head.weight"] is state["model.embed_tokens.weight"]
    untied_without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    with pytest.raises(ConversionError, match=r"missing tensors: lm_head.weight$"):
        convert_state_dict(untied_without_head, config)
