"""Convert local Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Kimi Linear checkpoints into `AttnResLM`.

The first four families are pre-norm RMSNorm decoders with RoPE, grouped-query attention and a SwiGLU
MLP: exactly the attnres decoder (Qwen3 adds per-head q/k RMSNorm, Qwen2 q/k/v biases), with HF's
parameter names under a `model.` prefix. Kimi Linear is the attnres decoder with its latent
attention, delta attention and mixture-of-experts options (attnres.hf.kimi_linear). Anything that would compute a different function (mixture
of experts, other norms or activations, scaled RoPE, a sliding window that clips, extra biases) is
refused with a `ConversionError` naming it, never approximated.

Reading and checking happen before the model is built: `model_config_from_hf` refuses unsupported
configs before any weight is read, and every tensor's name and shape is checked against the config.
Nothing is unpickled except through `torch.load(weights_only=True)`. This module does not import
transformers.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnres.common.json_files import CONFIG_FILE, read_json_object
from attnres.hf.conversion_error import ConversionError, per_layer_list
from attnres.hf.gguf import read_gguf_config, read_gguf_weights
from attnres.hf.kimi_linear import MODEL_TYPE as KIMI_LINEAR
from attnres.hf.kimi_linear import RENAMED, kimi_linear_fields, runtime_state
from attnres.model import AttnResLM, ConfigError, ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", KIMI_LINEAR)

# Values transformers' own config classes (5.x, unchanged from 4.x for these keys) use when a key is
# absent from config.json, so a sparse config converts to the model transformers would build.
# RoPE theta defaults to RotaryEmbeddingConfigMixin.default_theta = 10000 for all four families.
_FAMILY_DEFAULTS = {
    "qwen3": dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768, sliding_window=4096),
    "qwen2": dict(num_key_value_heads=32, head_dim=None, max_position_embeddings=32768, sliding_window=4096),
    "llama": dict(num_key_value_heads=None, head_dim=None, max_position_embeddings=2048, sliding_window=None),
    "mistral": dict(num_key_value_heads=8, head_dim=None, max_position_embeddings=131072, sliding_window=4096),
}
_DEFAULT_ROPE_THETA = 10_000.0
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_MAX_WINDOW_LAYERS = 28  # Qwen2/Qwen3: layers below this index never slide

# Why well-known unsupported architectures differ, so the refusal says more than "unknown".
_MOE = "mixture-of-experts MLPs"
_ARCHITECTURE_NOTES = {
    "gpt2": "LayerNorm with biases, learned absolute position embeddings, fused Conv1D attention, GELU MLP",
    "opt": "LayerNorm (post-norm in some sizes), learned absolute position embeddings, ReLU MLP",
    "bert": "a post-norm encoder", "roberta": "a post-norm encoder",
    "gptj": "parallel attention and MLP sub-layers", "gpt_neox": "parallel attention and MLP sub-layers",
    "falcon": "parallel attention and MLP sub-layers", "phi": "parallel attention and MLP sub-layers",
    "cohere": "parallel attention and MLP sub-layers",
    "gemma": "(1 + weight) RMSNorm gains, a GELU MLP and scaled embeddings",
    "gemma2": "post-sub-layer norms, logit soft-capping and a GELU MLP",
    "mixtral": _MOE, "qwen2_moe": _MOE, "qwen3_moe": _MOE, "deepseek_v2": _MOE, "deepseek_v3": _MOE,
    "olmoe": _MOE, "dbrx": _MOE, "jamba": _MOE, "granitemoe": _MOE, "phimoe": _MOE,
}
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Tensors older checkpoints saved that are not parameters (the RoPE table is recomputed).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_LIST_LIMIT = 12
# A checkpoint's weights: one file, or shards that its index names (safetensors preferred).
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


# ----------------------------------------------------------------------------------------------
# Config


def model_config_from_hf(hf_config: dict, residual: str = "standard", residual_options=None,
                         max_seq_len: int | None = None) -> ModelConfig:
    """The attnres `ModelConfig` of a parsed HF config.json (model_type llama, mistral, qwen2, qwen3 or kimi_linear).

    `residual` and `residual_options` (an options object, a dict or None) choose the variant (see `ModelConfig`).
    `max_seq_len` defaults to `max_position_embeddings`; a smaller one lets a checkpoint whose
    sliding window never clips at that length convert. Raises ConversionError naming any feature
    that would make attnres compute a different function than transformers.
    """
    quantization = hf_config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "not named") if isinstance(quantization, dict) else quantization
        raise ConversionError(f"config.json has a quantization_config (quant_method {method!r}): the weights are "
                              f"quantised, and attnres converts unquantised ones (fp32, bf16, fp16); convert the "
                              f"unquantised model, or dequantise this one first")
    fields = _layout_fields(hf_config)
    model_type = hf_config["model_type"]
    if model_type == KIMI_LINEAR:
        if max_seq_len is not None:
            fields["max_seq_len"] = max_seq_len
        return _build_config(model_type, **fields, residual=residual, residual_options=residual_options)
    if max_seq_len is None:
        max_seq_len = hf_config.get("max_position_embeddings", _FAMILY_DEFAULTS[model_type]["max_position_embeddings"])
    act = hf_config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers maps both names to SiLU
        raise ConversionError(f"{model_type}: hidden_act={act!r} is not supported; attnres's MLP is SwiGLU "
                              f"(hidden_act 'silu')")
    fields["rope_theta"] = _rope_theta(hf_config)
    config = _build_config(model_type, **fields, residual=residual, residual_options=residual_options,
                           max_seq_len=max_seq_len)
    _check_attention_window(hf_config, config.num_layers, config.max_seq_len)
    return config


def _layout_fields(hf_config: dict) -> dict:
    """ModelConfig fields that fix the parameter layout, after refusing other architectures."""
    if not isinstance(hf_config, dict):
        raise ConversionError(f"the HF config must be a dict (parsed config.json), got {type(hf_config).__name__}")
    model_type = hf_config.get("model_type")
    if model_type == KIMI_LINEAR:
        return kimi_linear_fields(hf_config)
    for key in _EXPERT_KEYS:
        experts = hf_config.get(key)
        if isinstance(experts, (int, float)) and not isinstance(experts, bool) and experts > 0:
            raise ConversionError(f"model_type={model_type!r}: {_MOE} ({key}={experts}) are not supported; "
                                  f"attnres converts dense models only: {list(SUPPORTED_MODEL_TYPES)}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        if not isinstance(model_type, str):
            raise ConversionError(f"config.json has no model_type (got {model_type!r}); supported model types: "
                                  f"{list(SUPPORTED_MODEL_TYPES)}")
        note = _ARCHITECTURE_NOTES.get(model_type)
        raise ConversionError(f"unsupported model_type {model_type!r}" + (f" ({note})" if note else "")
                              + f"; supported model types: {list(SUPPORTED_MODEL_TYPES)}")
    defaults = _FAMILY_DEFAULTS[model_type]
    missing = [k for k in _SHAPE_KEYS if k not in hf_config]
    if missing:
        raise ConversionError(f"{model_type} config.json lacks {missing}")
    if hf_config.get("mlp_bias"):
        raise ConversionError(f"{model_type}: mlp_bias=True (biases on the MLP projections) is not supported")
    attention_bias = model_type == "qwen2"  # q/k/v biases and no o_proj bias, whatever the config says
    if not attention_bias and hf_config.get("attention_bias"):
        # Llama and Qwen3 put the bias on o_proj too; attnres has biases on q/k/v only.
        raise ConversionError(f"{model_type}: attention_bias=True (a bias on o_proj as well as q/k/v) is not "
                              f"supported; attnres supports q/k/v biases only (as in qwen2)")
    heads = hf_config["num_attention_heads"]
    # An absent key takes the class default; an explicit null means "derive it", as transformers does.
    kv_heads = hf_config.get("num_key_value_heads", defaults["num_key_value_heads"])
    head_dim = hf_config.get("head_dim", defaults["head_dim"])
    hidden = hf_config["hidden_size"]
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        head_dim = hidden // heads  # floor division, as transformers computes it
    return dict(
        vocab_size=hf_config["vocab_size"], hidden_size=hidden, num_layers=hf_config["num_hidden_layers"],
        num_heads=heads, num_kv_heads=heads if kv_heads is None else kv_heads, head_dim=head_dim,
        intermediate_size=hf_config["intermediate_size"],
        tie_embeddings=hf_config.get("tie_word_embeddings", False),  # False is every family's class default
        qk_norm=model_type == "qwen3", attention_bias=attention_bias,
        norm_eps=hf_config.get("rms_norm_eps", _DEFAULT_RMS_NORM_EPS))


def _rope_theta(hf_config: dict) -> float:
    """RoPE base of an unscaled rotary embedding; refuses every scaled or partial RoPE."""
    model_type = hf_config["model_type"]
    # transformers 5 reads a legacy `rope_scaling` in place of `rope_parameters`; older configs keep
    # rope_theta at the top level.
    source = "rope_scaling" if hf_config.get("rope_scaling") else "rope_parameters"
    params = hf_config.get(source) or {}
    if not isinstance(params, dict):
        raise ConversionError(f"{model_type}: {source} must be a dict, got {params!r}")
    if any(isinstance(v, dict) for v in params.values()):
        raise ConversionError(f"{model_type}: per-layer-type {source} ({sorted(params)}) are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConversionError(f"{model_type}: RoPE scaling {source}.rope_type={rope_type!r} is not supported; "
                              f"attnres implements unscaled RoPE only (rope_type 'default')")
    partial = params.get("partial_rotary_factor", hf_config.get("partial_rotary_factor"))
    if partial is not None and partial != 1:
        raise ConversionError(f"{model_type}: partial rotary embedding (partial_rotary_factor={partial}) is not "
                              f"supported; attnres rotates every head dimension")
    theta = params.get("rope_theta", hf_config.get("rope_theta"))
    return _DEFAULT_ROPE_THETA if theta is None else theta


def _check_attention_window(hf_config: dict, num_layers: int, max_seq_len: int) -> None:
    """Refuse attention that differs from full causal attention on sequences up to max_seq_len.

    A sliding window of W keys changes nothing while every query sees at most W keys (position
    t - W + 1 .. t), i.e. for max_seq_len <= W; only a window that can clip is refused.
    """
    model_type = hf_config["model_type"]
    layer_types = per_layer_list(hf_config, "layer_types")
    if layer_types is not None:
        other = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})
        if other:
            raise ConversionError(f"{model_type}: layer_types {other} are not supported; attnres layers use "
                                  f"full causal attention ('full_attention')")
    window = hf_config.get("sliding_window", _FAMILY_DEFAULTS[model_type]["sliding_window"])  # null: none
    if model_type == "mistral":  # transformers' Mistral ignores layer_types and slides on every layer
        sliding = list(range(num_layers)) if window is not None else []
    elif model_type in ("qwen2", "qwen3"):
        if not hf_config.get("use_sliding_window", False):
            window = None  # transformers drops the window unless use_sliding_window is set
        if layer_types is None:  # transformers derives them: sliding from max_window_layers on
            first = hf_config.get("max_window_layers", _DEFAULT_MAX_WINDOW_LAYERS)
            layer_types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                           for i in range(num_layers)]
        sliding = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
    else:
        sliding = [i for i, t in enumerate(layer_types or []) if t == "sliding_attention"]
    if not sliding:
        return
    everywhere = sliding == list(range(num_layers))
    shown = f"all {num_layers} layers" if everywhere else f"layers {_listing([str(i) for i in sliding])}"
    if window is None:  # a layer marked sliding without a window: refuse rather than guess what it means
        raise ConversionError(f"{model_type}: layer_types marks {shown} as 'sliding_attention' but no "
                              f"sliding_window is in effect; attnres supports full causal attention only")
    if isinstance(window, bool) or not isinstance(window, int):
        raise ConversionError(f"{model_type}: sliding_window must be an integer or null, got {window!r}")
    if window < max_seq_len:
        raise ConversionError(
            f"{model_type}: sliding-window attention (sliding_window={window} on {shown}) is not "
            f"supported; it clips sequences longer than the window, and max_seq_len={max_seq_len}. "
            f"Convert with max_seq_len <= sliding_window to use the model where the window never clips")


def _build_config(model_type: str, **fields) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ConfigError as error:
        raise ConversionError(f"{model_type} config does not give a valid attnres ModelConfig: {error}") from error


# ----------------------------------------------------------------------------------------------
# Weights


def convert_state_dict(hf_state: dict, config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF state dict (`model.`-prefixed names, `lm_head.weight`) -> AttnResLM state dict.

    Returns every non-routing entry of `AttnResLM(config).state_dict()`, tensors shared with the
    input (no copies): embed_tokens.weight (V, D), layers.i.* (HF's shapes), norm.weight (D,),
    lm_head.weight (V, D) (the embedding itself when tied). A tied checkpoint's separate lm_head is
    accepted only if equal to the embedding. RoPE tables (`rotary_emb.inv_freq`) are ignored; any
    other missing, extra or mis-shaped tensor raises ConversionError naming it.
    """
    expected = _expected_shapes(config)
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, tensor in hf_state.items():
        name = key.removeprefix("model.")
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        name = next((name.removesuffix(old) + new for old, new in RENAMED.items() if name.endswith(old)), name)
        if name not in expected or not isinstance(tensor, torch.Tensor):
            unexpected.append(key)
        elif name in state:
            raise ConversionError(f"the checkpoint holds {name!r} twice (with and without the 'model.' prefix)")
        else:
            state[name] = tensor
    if config.tie_embeddings:
        head, embed = state.pop("lm_head.weight", None), state.get("embed_tokens.weight")
        check_tied_head(head, embed)
        if embed is not None:
            state["lm_head.weight"] = embed
    problems = []
    if unexpected:
        problems.append(f"tensors the config does not describe: {_listing(unexpected)}")
    missing = [_hf_name(n) for n in expected if n not in state]
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    mismatched = [f"{_hf_name(n)}: expected shape {expected[n]} from the config, found {tuple(state[n].shape)}"
                  for n in expected if n in state and tuple(state[n].shape) != expected[n]]
    if mismatched:
        problems.append(f"shape mismatches: {_listing(mismatched, sep='; ')}")
    if problems:
        raise ConversionError("the weights do not match the config: " + "; ".join(problems))
    return {name: state[name] for name in expected}


def check_tied_head(head: torch.Tensor | None, embed: torch.Tensor | None) -> None:
    """ConversionError when a tied checkpoint's lm_head.weight (V, D) is there and differs from its embedding."""
    if head is not None and embed is not None and not (head.shape == embed.shape and torch.equal(head, embed)):
        raise ConversionError("tie_word_embeddings is true but the checkpoint's lm_head.weight differs from "
                              "model.embed_tokens.weight; set tie_word_embeddings false in config.json "
                              "to keep both")


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Non-routing state-dict names and shapes of AttnResLM(config), from a weightless (meta) model."""
    with torch.device("meta"):
        model = AttnResLM(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items() if not name.startswith("residual.")}


def _hf_name(name: str) -> str:
    return name if name == "lm_head.weight" else f"model.{name}"


def _listing(items: list[str], sep: str = ", ") -> str:
    shown = sep.join(items[:_LIST_LIMIT])
    return shown + (f"{sep}... ({len(items) - _LIST_LIMIT} more)" if len(items) > _LIST_LIMIT else "")


# ----------------------------------------------------------------------------------------------
# Reading


def read_hf_checkpoint(path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(parsed config.json, raw state dict {HF name: tensor}) of a local HF checkpoint directory.

    Weights: model.safetensors, sharded safetensors with model.safetensors.index.json, or
    pytorch_model.bin (optionally sharded with its index), loaded with torch.load(weights_only=True).
    The architecture must be one attnres converts and every tensor's name and shape must match
    config.json; otherwise ConversionError names the problem (config features that change only the
    computed function, such as RoPE scaling, are left to `model_config_from_hf`).
    """
    hf_config = _read_config(path)
    # Only the parameter layout matters here: RoPE, activation and window are checked on conversion.
    layout = _build_config(hf_config.get("model_type"), **_layout_fields(hf_config))
    state = _read_weights(path, hf_config)
    convert_state_dict(state, layout)
    return hf_config, state


def read_source_config(path) -> dict:
    """The Hugging Face config dict of a checkpoint directory (its config.json) or a .gguf file (from its
    metadata, through transformers); ConversionError when there is none."""
    return read_gguf_config(path) if str(path).endswith(".gguf") else _read_config(path)


def _checkpoint_directory(path) -> Path:
    directory = Path(path)
    if not directory.exists():
        raise ConversionError(f"checkpoint directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise ConversionError(f"{str(directory)!r} is not a directory; pass a Hugging Face checkpoint directory "
                              f"(config.json and weight files)")
    return directory


def _read_config(path) -> dict:
    return read_json_object(_checkpoint_directory(path) / CONFIG_FILE, "checkpoint", error=ConversionError,
                            hint="a Hugging Face checkpoint directory holds config.json and its weight files")


def _read_weights(path, hf_config: dict, load_safetensors=None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint directory's weight files (safetensors preferred), {HF name: tensor}; a
    Kimi Linear checkpoint's in transformers' run-time layout (`attnres.hf.kimi_linear.runtime_state`).
    load_safetensors reads one safetensors file (streaming passes a reader of its header alone)."""
    directory = _checkpoint_directory(path)
    for (single, index), load in ((SAFETENSORS_FILES, load_safetensors or _load_safetensors),
                                  (TORCH_FILES, _load_torch)):
        if (directory / single).is_file():
            state = load(directory / single)
        elif (directory / index).is_file():
            state = _read_sharded(directory / index, load)
        else:
            continue
        return runtime_state(state) if hf_config.get("model_type") == KIMI_LINEAR else state
    shards = sorted(p.name for p in directory.glob("*.safetensors")) + sorted(p.name for p in directory.glob("*.bin"))
    if shards:
        raise ConversionError(f"{str(directory)!r} has weight shards {_listing(shards)} but no "
                              f"model.safetensors.index.json / pytorch_model.bin.index.json naming them")
    raise ConversionError(f"{str(directory)!r} has no weight files (model.safetensors, sharded safetensors with "
                          f"model.safetensors.index.json, or pytorch_model.bin)")


def _read_sharded(index_path: Path, load) -> dict[str, torch.Tensor]:
    weight_map = read_json_object(index_path, "checkpoint", error=ConversionError,
                                  hint="a shard index is a JSON object with 'weight_map'").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConversionError(f"{index_path}: weight_map must map tensor names to shard file names")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        # Shard names are file names in the checkpoint directory; refuse paths that would leave it.
        if Path(shard).name != shard:
            raise ConversionError(f"{index_path}: shard {shard!r} is not a file name in the checkpoint directory")
        if not (index_path.parent / shard).is_file():
            raise ConversionError(f"{index_path} names shard {shard!r}, which is missing")
        tensors = load(index_path.parent / shard)
        listed = [name for name, file in weight_map.items() if file == shard and name not in tensors]
        if listed:
            raise ConversionError(f"{index_path} places {_listing(listed)} in {shard!r}, which does not hold them")
        twice = [name for name in tensors if name in state]
        if twice:
            raise ConversionError(f"tensors {_listing(twice)} appear in more than one shard (again in {shard!r})")
        state.update(tensors)
    return state


def _read_safetensors(what, read, *args):
    """read(*args); a failure to read `what` (a safetensors file, a part of one) as one ConversionError."""
    try:
        return read(*args)
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ConversionError(f"cannot read {what} (corrupt or truncated safetensors file?): "
                              f"{error}") from error


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    return _read_safetensors(file, load_file, file, "cpu")


def _load_torch(file: Path) -> dict[str, torch.Tensor]:
    try:
        # weights_only: a checkpoint may carry pickled code; only tensors and plain containers load.
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError, AttributeError) as error:
        raise ConversionError(f"cannot read {file} with torch.load(weights_only=True) (corrupt, or holding "
                              f"objects other than tensors?): {error}") from error
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConversionError(f"{file} must hold a flat dict of tensors (a state dict)")
    return state


# ----------------------------------------------------------------------------------------------
# Whole conversion


def _source_weights(config: ModelConfig) -> int:
    """How many weights a source checkpoint of `config` holds: the model's parameters but the routers'
    (counted on the meta device: nothing is allocated)."""
    with torch.device("meta"):
        model = AttnResLM(config)
    routing = {name for name, _ in model.routing_parameters()}
    return sum(p.numel() for name, p in model.named_parameters() if name not in routing)


def _check_finite(path, state: dict[str, torch.Tensor]) -> None:
    """ConversionError naming the first tensor holding NaN or infinity: a model converted from it
    computes NaN, and nothing downstream would say why."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            count = int((~torch.isfinite(tensor)).sum())
            raise ConversionError(f"{path}: tensor {name} (in attnres' names) holds {count:,} NaN or infinite "
                                  f"values; the source checkpoint is damaged")


def convert_checkpoint(path, residual: str = "standard", residual_options=None, dtype: torch.dtype = torch.float32,
                       max_seq_len: int | None = None, source_config: dict | None = None) -> AttnResLM:
    """An `AttnResLM` (eval mode, parameters in `dtype`) holding a local HF checkpoint's weights.

    path: a Hugging Face checkpoint directory, or a `.gguf` file (read through transformers).
    source_config: `read_source_config(path)` when the caller has read it already (reading a GGUF
    file's metadata takes seconds); read here otherwise.

    Config refusals come first, before any weight is read. Routers are not in the checkpoint and
    keep their initialisation (zero queries, zero gates), so `standard` and the function-preserving
    variants (`full_attnres`, `block_attnres`, `delta_attnres`, `delta_block` with
    exact_conversion "gate" or "partial") compute the source model's logits (method §4, up to the
    RMSNorm eps); plain `delta_block` does not.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConversionError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if source_config is None:
        source_config = read_source_config(path)
    config = model_config_from_hf(source_config, residual=residual, residual_options=residual_options,
                                  max_seq_len=max_seq_len)
    gguf = str(path).endswith(".gguf")  # transformers reads and dequantises it (needs gguf, accelerate)
    state = read_gguf_weights(path, _source_weights(config)) if gguf else _read_weights(path, source_config)
    state = convert_state_dict(state, config)
    _check_finite(path, state)
    # Build directly in `dtype` so a bf16 conversion never holds an fp32 copy of the model.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = AttnResLM(config)
    finally:
        torch.set_default_dtype(previous)
    result = model.load_state_dict(state, strict=False)
    routing = {name for name, _ in model.routing_parameters()}
    unexplained = [k for k in result.missing_keys if k not in routing]
    if unexplained or result.unexpected_keys:
        raise ConversionError(f"internal mapping error: missing {unexplained}, unexpected {result.unexpected_keys}")
    return model.eval()
