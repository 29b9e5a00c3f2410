"""Kimi Linear's config.json as attnres `ModelConfig` fields (model_type "kimi_linear").

Kimi Linear (transformers' `KimiLinearForCausalLM`) is the attnres decoder with three options set:
multi-head latent attention in its full-attention layers (`mla`), Kimi Delta Attention in its
linear ones (`kda`, placed by `layer_types`), and DeepSeek-V3's mixture of experts after its first
dense layers (`moe`). Its parameter names are attnres's, except the router's score-correction bias
(`RENAMED`). Keys are read under both spellings transformers accepts (e.g. num_experts or
num_local_experts), and an absent key takes KimiLinearConfig's class default, so a sparse
config.json converts to the model transformers would build. Anything attnres would compute
differently is refused with a ConversionError naming it.

On disk a Kimi Linear checkpoint keeps its original layout, which transformers rearranges when it
loads one and restores when it saves one; `runtime_state` does the same rearrangement:
`block_sparse_moe.` is the feed-forward (`mlp.`); experts are separate w1 (gate), w3 (up) and w2
(down) matrices, stacked here into gate_up_proj (E, 2F, D) and down_proj (E, D, F); the q, k and v
convolutions are three (C, 1, K) filters, joined into one over 3C channels; the forget gate's
f_a_proj, f_b_proj, dt_bias and A_log sit on the attention, moved under `forget_gate.`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from attnres.hf.conversion_error import ConversionError, per_layer_list
from attnres.model.model_config import KIMI_FIRST_FULL_TRANSFORMERS, kimi_linear_layer_types

MODEL_TYPE = "kimi_linear"
# checkpoint name -> attnres name, as a suffix of a layer's parameter
RENAMED = {"mlp.gate.e_score_correction_bias": "mlp.gate.score_bias"}

# KimiLinearConfig's class defaults (transformers 5.x) for the keys read here.
_DEFAULTS = dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
                 num_hidden_layers=27, num_attention_heads=32, num_shared_experts=1, routed_scaling_factor=2.446,
                 kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                 num_expert_group=1, topk_group=1, num_experts_per_token=8, moe_renormalize=True, hidden_act="silu",
                 model_max_length=1048576, initializer_range=0.02, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 attention_bias=False, num_experts=256, linear_head_dim=128, linear_num_heads=32,
                 linear_conv_kernel_dim=4, first_k_dense_replace=1)
# transformers' other spelling of a key (its attribute_map), read when the first is absent
_ALIASES = {"num_experts": "num_local_experts", "num_experts_per_token": "num_experts_per_tok",
            "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
            "num_expert_group": "n_group", "model_max_length": "max_position_embeddings"}


def _get(hf_config: dict, key: str):
    """hf_config[key], else its value under the alias, else KimiLinearConfig's default."""
    return hf_config.get(key, hf_config.get(_ALIASES.get(key), _DEFAULTS[key]))


def kimi_linear_fields(hf_config: dict) -> dict:
    """ModelConfig fields (without the residual) of a parsed Kimi Linear config.json."""
    act = _get(hf_config, "hidden_act")
    if act not in ("silu", "swish"):
        raise ConversionError(f"{MODEL_TYPE}: hidden_act={act!r} is not supported; attnres's MLPs are SwiGLU "
                              f"(hidden_act 'silu')")
    router_act = hf_config.get("moe_router_activation_func", "sigmoid")
    if router_act != "sigmoid":  # transformers' Kimi Linear router is always a sigmoid
        raise ConversionError(f"{MODEL_TYPE}: moe_router_activation_func={router_act!r} is not supported; "
                              f"transformers' Kimi Linear scores experts with 'sigmoid'")
    layers = _get(hf_config, "num_hidden_layers")
    heads = _get(hf_config, "num_attention_heads")
    v_head_dim = _get(hf_config, "v_head_dim")
    if v_head_dim is None:
        raise ConversionError(f"{MODEL_TYPE}: v_head_dim is null; attnres needs the value head width")
    mla = dict(kv_lora_rank=_get(hf_config, "kv_lora_rank"), q_lora_rank=_get(hf_config, "q_lora_rank"),
               qk_nope_head_dim=_get(hf_config, "qk_nope_head_dim"),
               qk_rope_head_dim=_get(hf_config, "qk_rope_head_dim"), v_head_dim=v_head_dim)
    linear = hf_config.get("linear_attn_config") or {}
    if not isinstance(linear, dict):
        raise ConversionError(f"{MODEL_TYPE}: config.json's linear_attn_config must be an object (num_heads, "
                              f"head_dim, short_conv_kernel_size, full_attn_layers, kda_layers), got {linear!r:.120}")
    kda = dict(num_heads=linear.get("num_heads", _get(hf_config, "linear_num_heads")),
               head_dim=linear.get("head_dim", _get(hf_config, "linear_head_dim")),
               short_conv_kernel_size=linear.get("short_conv_kernel_size", _get(hf_config, "linear_conv_kernel_dim")))
    experts = _get(hf_config, "num_experts")
    return dict(
        vocab_size=_get(hf_config, "vocab_size"), hidden_size=_get(hf_config, "hidden_size"), num_layers=layers,
        num_heads=heads, num_kv_heads=heads, head_dim=mla["qk_rope_head_dim"],
        intermediate_size=_get(hf_config, "intermediate_size"),
        moe=_moe(hf_config, layers) if experts else None, mla=mla, kda=kda,
        layer_types=_layer_types(hf_config, linear, layers), tie_embeddings=_get(hf_config, "tie_word_embeddings"),
        qk_norm=False, attention_bias=_get(hf_config, "attention_bias"), norm_eps=_get(hf_config, "rms_norm_eps"),
        max_seq_len=_get(hf_config, "model_max_length"), init_std=_get(hf_config, "initializer_range"))


def _moe(hf_config: dict, layers: int) -> dict:
    """MoEConfig fields: DeepSeek-V3's router (sigmoid scores, score-correction bias, fp32 router)."""
    kinds = per_layer_list(hf_config, "mlp_layer_types")
    if kinds is None:
        dense = min(_get(hf_config, "first_k_dense_replace"), layers)
    else:
        dense = next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))
        if list(kinds) != ["dense"] * dense + ["sparse"] * (len(kinds) - dense):
            raise ConversionError(f"{MODEL_TYPE}: mlp_layer_types {kinds!r} is not supported; attnres keeps the "
                                  f"first layers dense and the rest experts ('dense', ..., 'sparse', ...)")
    return dict(num_experts=_get(hf_config, "num_experts"), experts_per_token=_get(hf_config, "num_experts_per_token"),
                expert_size=_get(hf_config, "moe_intermediate_size"),
                shared_experts=_get(hf_config, "num_shared_experts") or 0, scoring="sigmoid",
                normalize_top_k=_get(hf_config, "moe_renormalize"),
                routed_scale=_get(hf_config, "routed_scaling_factor"), num_groups=_get(hf_config, "num_expert_group"),
                groups_per_token=_get(hf_config, "topk_group"), score_bias=True, router_numerics="deepseek",
                dense_layers=dense)


def _layer_types(hf_config: dict, linear: dict, layers: int) -> list[str]:
    """Each layer's token mixer, as transformers' KimiLinearConfig decides it: `layer_types`, else the
    checkpoint's 1-based full_attn_layers / kda_layers, else its default (layers 4, 8, ... counting from
    0 full: `KIMI_FIRST_FULL_TRANSFORMERS`, not ModelConfig's own default for `kda`). Its
    "full_attention" layers are latent attention: "latent_attention" in attnres."""
    if per_layer_list(hf_config, "layer_types") is not None:
        return ["latent_attention" if kind == "full_attention" else kind for kind in hf_config["layer_types"]]
    if "full_attn_layers" in linear and "kda_layers" in linear:
        types = [None] * layers
        for key, kind in (("full_attn_layers", "latent_attention"), ("kda_layers", "linear_attention")):
            for number in linear[key]:
                if not (isinstance(number, int) and 1 <= number <= layers):
                    raise ConversionError(f"{MODEL_TYPE}: linear_attn_config.{key} holds {number!r}; layers are "
                                          f"numbered from 1 to num_hidden_layers={layers}")
                types[number - 1] = kind
        return types
    return list(kimi_linear_layer_types(layers, KIMI_FIRST_FULL_TRANSFORMERS, "latent_attention"))


_FORGET_GATE = re.compile(r"(.*\.self_attn\.)(f_a_proj\.weight|f_b_proj\.weight|dt_bias|A_log)")
_CONV = re.compile(r"(.*\.self_attn\.)([qkv])_conv1d\.weight")
_EXPERT = re.compile(r"(.*\.mlp\.experts\.)(\d+)\.(w[123])\.weight")


@dataclass(frozen=True)
class Parts:
    """How one run-time tensor is made of checkpoint tensors: `names` in order, concatenated along dim 0;
    with `per_entry` k > 0, each k consecutive ones are concatenated and the results stacked on a new
    leading dim (experts). Either way the run-time tensor's bytes are the parts' bytes in this order,
    which lets a streaming conversion write each part where it belongs (attnres.hf.streaming)."""

    names: tuple[str, ...]
    per_entry: int = 0

    def assemble(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The run-time tensor of the parts' tensors (in `names` order); a lone part is returned itself.
        ConversionError, in the checkpoint's names, for an integer tensor or parts that do not fit together."""
        self.check(tensors)
        if not self.per_entry:
            return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        k = self.per_entry
        return torch.stack([torch.cat(tensors[i:i + k]) if k > 1 else tensors[i] for i in range(0, len(tensors), k)])

    def check(self, tensors: list[torch.Tensor]) -> None:
        """Before any tensor is joined: every part floating-point (an int8 expert would be cast to float,
        a quantised value read as a weight), the experts' parts of one shape, and the concatenated parts
        (a short convolution's q, k and v) of one shape past their first dim."""
        for name, tensor in zip(self.names, tensors):
            if not tensor.is_floating_point():
                raise ConversionError(f"{MODEL_TYPE}: the checkpoint's {name} is {tensor.dtype}; attnres converts "
                                      f"floating-point weights: dequantise the checkpoint first")
        first, shape = self.names[0], tuple(tensors[0].shape)
        for name, tensor in zip(self.names[1:], tensors[1:]):
            fits = tuple(tensor.shape) == shape if self.per_entry else (
                tensor.dim() == len(shape) and tuple(tensor.shape[1:]) == shape[1:])
            if not fits:
                what = "shape" if self.per_entry else "shape past its first dim"
                raise ConversionError(f"{MODEL_TYPE}: the checkpoint's {name} is {tuple(tensor.shape)} but {first} is "
                                      f"{shape}; the tensors of one set must have the same {what}")


def runtime_layout(names) -> dict[str, Parts]:
    """{run-time name: its `Parts`} for a Kimi Linear checkpoint's tensor names (module doc); names
    already in the run-time layout map to themselves. ConversionError names a convolution or an
    expert matrix that is missing from a set."""
    layout: dict[str, Parts] = {}
    convs: dict[str, dict[str, str]] = {}
    experts: dict[str, dict[tuple[int, str], str]] = {}
    for key in names:
        name = key.replace(".block_sparse_moe.", ".mlp.")
        if match := _FORGET_GATE.fullmatch(name):
            name = f"{match[1]}forget_gate.{match[2]}"
        if match := _CONV.fullmatch(name):
            convs.setdefault(match[1], {})[match[2]] = key
        elif match := _EXPERT.fullmatch(name):
            experts.setdefault(match[1], {})[int(match[2]), match[3]] = key
        else:
            layout[name] = Parts((key,))
    for prefix, parts in convs.items():
        missing = [f"{prefix}{part}_conv1d.weight" for part in "qkv" if part not in parts]
        if missing:
            raise ConversionError(f"{MODEL_TYPE}: the checkpoint lacks {missing}")
        layout[prefix + "conv1d.weight"] = Parts(tuple(parts[part] for part in "qkv"))
    for prefix, parts in experts.items():
        count = 1 + max(index for index, _ in parts)
        missing = [f"{prefix}{e}.{w}.weight" for e in range(count) for w in ("w1", "w2", "w3") if (e, w) not in parts]
        if missing:
            raise ConversionError(f"{MODEL_TYPE}: the checkpoint lacks {missing[:12]}"
                                  + (f" ({len(missing) - 12} more)" if len(missing) > 12 else ""))
        # gate_up_proj (E, 2F, D): expert e's w1 (gate) rows, then its w3 (up) rows; down_proj (E, D, F)
        layout[prefix + "gate_up_proj"] = Parts(tuple(parts[e, w] for e in range(count) for w in ("w1", "w3")), 2)
        layout[prefix + "down_proj"] = Parts(tuple(parts[e, "w2"] for e in range(count)), 1)
    return layout


def runtime_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Kimi Linear checkpoint's tensors under the names and shapes of transformers' modules (module
    doc, `runtime_layout`); tensors already in that layout pass unchanged. ConversionError names a
    convolution or an expert matrix that is missing from a set."""
    return {name: parts.assemble([hf_state[key] for key in parts.names])
            for name, parts in runtime_layout(hf_state).items()}
