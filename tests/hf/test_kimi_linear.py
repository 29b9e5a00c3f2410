"""Kimi Linear (mixture of experts, latent attention, Kimi Delta Attention) against transformers'
`KimiLinearForCausalLM`: tiny random checkpoints saved by transformers convert to the same logits in
float64, the function-preserving variants start as that model, and the converted model saves,
loads and generates through `AutoModelForCausalLM` as transformers' own does, padded batches included.
"""

import pytest
import torch

from attnres.hf.convert import ConversionError, convert_checkpoint, model_config_from_hf
from attnres.hf.kimi_linear import kimi_linear_fields, runtime_state
from attnres.model.model_config import (FULL_ATTENTION_EVERY, KIMI_FIRST_FULL_TRANSFORMERS, default_layer_types,
                                  kimi_linear_layer_types)
from attnres.residual import VARIANTS
from tests.helpers import kimi_linear_in_float64, options_of

transformers = pytest.importorskip("transformers")

VOCAB = 96
BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
            num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, linear_num_heads=2, linear_head_dim=8,
            initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
# The configuration (4 layers, 2 of them MLA, 8 experts top-2 plus 1 shared, first layer dense),
# then one with a low-rank query, grouped routing and other widths in transformers' default layer
# pattern, then one read from a checkpoint's linear_attn_config with two dense layers.
SHAPES = {
    "issue": dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
                  mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    "grouped": dict(num_hidden_layers=5, q_lora_rank=12, n_group=2, topk_group=1, v_head_dim=12,
                    linear_conv_kernel_dim=3, linear_head_dim=6, attention_bias=True, routed_scaling_factor=1.5,
                    mlp_layer_types=["dense"] + ["sparse"] * 4),
    "checkpoint": dict(num_hidden_layers=3, linear_attn_config={"full_attn_layers": [3], "kda_layers": [1, 2],
                                                                "num_heads": 4, "head_dim": 4,
                                                                "short_conv_kernel_size": 2},
                       mlp_layer_types=["dense", "dense", "sparse"], norm_topk_prob=False),
}
# The routed variants start as the source model up to the RMSNorm eps (method §4: a norm sees the
# stream scaled by the routing's uniform average), so their identity is checked where eps is negligible.
SHAPES["tiny_eps"] = dict(SHAPES["issue"], rms_norm_eps=1e-12)


def save_kimi(directory, shape: str):
    """transformers' Kimi Linear of SHAPES[shape] with non-trivial weights, saved to `directory`; returns it."""
    config = transformers.KimiLinearConfig(**{**BASE, **SHAPES[shape]})
    torch.manual_seed(list(SHAPES).index(shape))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # gains away from 1
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias") and "dt_bias" not in name:
                p.copy_(0.3 * torch.randn_like(p))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a bias that changes which experts are picked
                buffer.copy_(0.2 * torch.randn_like(buffer))
        model.model.embed_tokens.weight.mul_(10.0)  # activations of realistic size (weights std 0.2)
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {shape: (directory, save_kimi(directory, shape))
            for shape in SHAPES for directory in [tmp_path_factory.mktemp(f"kimi-{shape}")]}


IDS = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))


def float64_reference(hf):
    """transformers' model in float64 with its eager experts (its grouped kernels refuse float64)."""
    reference = transformers.AutoModelForCausalLM.from_config(hf.config, attn_implementation="eager",
                                                              experts_implementation="eager", dtype=torch.float64)
    reference.load_state_dict(hf.state_dict())
    return reference.eval()


def logits(model, ids=IDS):
    with torch.no_grad():
        out = model(input_ids=ids) if isinstance(model, transformers.PreTrainedModel) else model(ids)
    return out.logits


def kimi_spelling(layer_types) -> list[str]:
    """attnres's layer types as Kimi Linear's config.json spells them: its latent attention is "full_attention"."""
    return ["full_attention" if t == "latent_attention" else t for t in layer_types]


@pytest.mark.parametrize("shape", SHAPES)
def test_standard_conversion_equals_kimi_linear_in_float64(checkpoints, shape, monkeypatch):
    kimi_linear_in_float64(monkeypatch)
    directory, hf = checkpoints[shape]
    model = convert_checkpoint(directory, dtype=torch.float64)
    config = model.config
    assert config.residual == "standard" and config.moe is not None and config.mla is not None
    assert kimi_spelling(config.layer_types) == hf.config.layer_types
    expected, got = logits(float64_reference(hf)), logits(model)
    assert expected.std() > 0.5  # logits of realistic size: a wrong scale would show
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


EXACT = [(name, 2 if VARIANTS[name].uses_blocks else None) for name in
         ("full_attnres", "block_attnres", "delta_attnres", "denseformer", "hyper_connections")]


@pytest.mark.parametrize("residual, num_blocks", EXACT, ids=[name for name, _ in EXACT])
def test_function_preserving_variants_start_as_kimi_linear(checkpoints, residual, num_blocks, monkeypatch):
    kimi_linear_in_float64(monkeypatch)
    directory, hf = checkpoints["tiny_eps"]
    model = convert_checkpoint(directory, residual=residual, residual_options=options_of(num_blocks=num_blocks),
                               dtype=torch.float64)
    torch.testing.assert_close(logits(model), logits(float64_reference(hf)), rtol=0, atol=1e-8)


def test_the_layer_pattern_and_experts_are_read_as_transformers_reads_them(checkpoints):
    for shape, (directory, hf) in checkpoints.items():
        config = convert_checkpoint(directory).config
        assert kimi_spelling(config.layer_types) == hf.config.layer_types, shape
        assert config.moe.dense_layers == hf.config.mlp_layer_types.count("dense"), shape
    grouped = convert_checkpoint(checkpoints["grouped"][0]).config
    assert grouped.layer_types[4] == "latent_attention" and grouped.layer_types.count("latent_attention") == 1
    assert grouped.mla.q_lora_rank == 12 and grouped.moe.num_groups == 2 and grouped.moe.routed_scale == 1.5
    kda = convert_checkpoint(checkpoints["checkpoint"][0]).config.kda
    assert (kda.num_heads, kda.head_dim, kda.short_conv_kernel_size) == (4, 4, 2)


@pytest.mark.parametrize("layers", [1, 4, 5, 8, 9, 12, 27])
def test_the_default_layer_patterns_are_transformers_and_the_checkpoints(layers):
    """Kimi Linear's 3:1 pattern has two defaults, both from `kimi_linear_layer_types`: a config.json with
    neither layer_types nor full_attn_layers converts to transformers' (0-based 4, 8, ... full); ModelConfig
    with `kda` and no layer_types takes the released checkpoints' (full_attn_layers 4, 8, ..., 1-based)."""
    reference = transformers.KimiLinearConfig(num_hidden_layers=layers).layer_types
    assert list(kimi_linear_layer_types(layers, KIMI_FIRST_FULL_TRANSFORMERS)) == reference
    assert kimi_spelling(kimi_linear_fields({"num_hidden_layers": layers})["layer_types"]) == reference
    full = list(range(FULL_ATTENTION_EVERY, layers + 1, FULL_ATTENTION_EVERY))  # as a checkpoint lists them
    linear = {"full_attn_layers": full, "kda_layers": [n for n in range(1, layers + 1) if n not in full]}
    from_checkpoint = transformers.KimiLinearConfig(num_hidden_layers=layers, linear_attn_config=linear).layer_types
    assert list(default_layer_types(layers, linear=True)) == from_checkpoint
    assert kimi_spelling(kimi_linear_fields({"num_hidden_layers": layers, "linear_attn_config": linear})[
        "layer_types"]) == from_checkpoint
    if layers >= FULL_ATTENTION_EVERY:  # transformers' default is the checkpoints' a layer later
        assert from_checkpoint != reference and reference[1:] == from_checkpoint[:-1]


@pytest.mark.parametrize("field, value, message", [
    ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
    ("moe_router_activation_func", "softmax", "moe_router_activation_func='softmax' is not supported"),
    ("mlp_layer_types", ["sparse", "dense", "sparse", "sparse"], "mlp_layer_types .* is not supported"),
    ("layer_types", ["linear_attention", "swa", "full_attention", "full_attention"], "ModelConfig.layer_types"),
    ("linear_attn_config", [{"num_heads": 2}], r"linear_attn_config must be an object \(num_heads, .*got \["),
    ("layer_types", 3, r"config\.json layer_types must be a list of strings, one per layer, got 3"),
    ("mlp_layer_types", True, r"config\.json mlp_layer_types must be a list of strings, one per layer, got True"),
])
def test_what_attnres_would_compute_differently_is_refused_by_name(checkpoints, field, value, message):
    values = checkpoints["issue"][1].config.to_dict()
    values[field] = value
    with pytest.raises(ConversionError, match=message):
        model_config_from_hf(values)


def test_the_converted_model_saves_loads_and_generates_as_transformers_does(checkpoints, tmp_path):
    import attnres.hf  # noqa: F401  (registers the Auto classes)
    from attnres.hf import save_hf

    directory, hf = checkpoints["issue"]
    model = convert_checkpoint(directory)
    save_hf(model, tmp_path / "converted")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "converted").eval()
    torch.testing.assert_close(logits(loaded), logits(hf), rtol=1e-5, atol=1e-5)
    prompt = torch.tensor([[0, 0, 7, 9, 11, 13], [5, 6, 7, 8, 9, 10]])  # the first row left-padded
    mask = (prompt != 0).long()
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=mask, **settings)
        got = loaded.generate(prompt, attention_mask=mask, **settings)
        alone = loaded.generate(prompt[:1, 2:], **settings)
    assert torch.equal(got, want)
    assert torch.equal(got[0, 2:], alone[0])  # the padded row decodes as the row alone


def _expert_state(**changed):
    """A layer's two experts and a short convolution, in the checkpoint's own names."""
    state = {f"model.layers.1.block_sparse_moe.experts.{e}.{w}.weight": torch.zeros((6, 4) if w != "w2" else (4, 6))
             for e in range(2) for w in ("w1", "w2", "w3")}
    state.update({f"model.layers.0.self_attn.{p}_conv1d.weight": torch.zeros(8, 1, 4) for p in "qkv"})
    return {**state, **changed}


@pytest.mark.parametrize("changed, message", [
    ({"model.layers.1.block_sparse_moe.experts.1.w1.weight": torch.zeros(5, 4)},
     r"experts\.1\.w1\.weight is \(5, 4\) but model\.layers\.1\.block_sparse_moe\.experts\.0\.w1\.weight is \(6, 4\)"),
    ({"model.layers.1.block_sparse_moe.experts.1.w2.weight": torch.zeros(1, 4, 6)},
     r"experts\.1\.w2\.weight is \(1, 4, 6\) but .*experts\.0\.w2\.weight is \(4, 6\)"),
    ({"model.layers.0.self_attn.k_conv1d.weight": torch.zeros(8, 1, 3)},
     r"k_conv1d\.weight is \(8, 1, 3\) but model\.layers\.0\.self_attn\.q_conv1d\.weight is \(8, 1, 4\); .* past its"),
    ({"model.layers.1.block_sparse_moe.experts.0.w3.weight": torch.zeros(6, 4, dtype=torch.int8)},
     r"the checkpoint's model\.layers\.1\.block_sparse_moe\.experts\.0\.w3\.weight is torch\.int8; .*dequantise"),
])
def test_parts_that_do_not_fit_together_are_refused_in_the_checkpoints_names(changed, message):
    """Checked before any tensor is stacked or joined (a stack of unequal experts was torch's error)."""
    assert set(runtime_state(_expert_state())) >= {"model.layers.1.mlp.experts.gate_up_proj",
                                                   "model.layers.0.self_attn.conv1d.weight"}
    with pytest.raises(ConversionError, match=message):
        runtime_state(_expert_state(**changed))
