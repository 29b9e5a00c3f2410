"""transformers' `generate` options -> attnres's compiled static-cache decoding (docs/explanation/fast-paths.md).

`AttnResForCausalLM.generate(..., cache_implementation="static")` and `generate_fast(...)` come
here. The options are merged exactly as transformers merges them (the call's keywords over
`generation_config` over the model's `generation_config.json` over transformers' defaults, with
transformers' own helpers), and the special tokens and the attention mask of an unpadded call are
prepared by transformers' own code too, so the output equals plain `generate`'s for greedy
decoding. What the compiled loop cannot do (beam search, logits processors, repetition penalties,
streamers, returning scores, ...) is refused by name rather than silently ignored.
"""

from __future__ import annotations

from transformers import GenerationConfig

from attnres.common.errors import InputError
from attnres.generation.fast_generator import GREEDY, FastGenerator, GenerationResult, Sampling

# Options the fast loop implements; every other generation option must keep transformers' default.
HANDLED = {"max_length", "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k",
           "top_p", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache",
           "cache_implementation", "compile_config", "disable_compile", "transformers_version",
           "_from_model_config"}


def static_cache_requested(model, generation_config: GenerationConfig | None, kwargs: dict) -> bool:
    """Whether a `generate` call asks for cache_implementation="static" (a keyword, else the config's)."""
    if "cache_implementation" in kwargs:
        return kwargs["cache_implementation"] == "static"
    config = generation_config if generation_config is not None else model.generation_config
    return getattr(config, "cache_implementation", None) == "static"


def generate_fast(model, inputs=None, generation_config: GenerationConfig | None = None, *,
                  precision: str = "fp32", stop_check_every: int | None = None, compile: bool | str | None = None,
                  **kwargs) -> GenerationResult:
    """`AttnResForCausalLM.generate_fast` of `model` (its doc gives the arguments): greedy or sampled
    generation through `attnres.generation.fast_generator`, a step compiled by "auto" in the device's
    default mode (attnres.generation.fast_generator.DEFAULT_MODES). Returns the GenerationResult."""
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    input_ids = inputs if inputs is not None else model_kwargs.pop("input_ids", None)
    model_kwargs.pop("input_ids", None)
    attention_mask = model_kwargs.pop("attention_mask", None)
    if input_ids is None:
        raise InputError("generate with cache_implementation='static' needs input_ids (a (batch, seq_len) tensor)")
    unsupported = sorted(key for key, value in model_kwargs.items() if value is not None)
    if unsupported:
        raise InputError(f"generate with cache_implementation='static' (attnres's compiled decoding) does not take "
                         f"{unsupported}; drop them, or drop cache_implementation for transformers' own loop")
    _check_options(config)
    batch, prompt = input_ids.shape if input_ids.dim() == 2 else (None, None)
    model._prepare_special_tokens(config, attention_mask is not None, device=input_ids.device, batch_size=batch)
    if attention_mask is None:
        attention_mask = model._prepare_attention_mask_for_generation(input_ids, config, {})
    if bool(attention_mask.bool().all()):
        attention_mask = None  # no padding: the model's unmasked prefill
    max_new = _max_new_tokens(model, config, kwargs, generation_config, prompt)
    min_new = max(config.min_new_tokens or 0, (config.min_length or 0) - prompt, 0)
    sampling = GREEDY
    if config.do_sample:
        sampling = Sampling(do_sample=True, temperature=float(config.temperature), top_k=config.top_k or None,
                            top_p=config.top_p if config.top_p is not None and config.top_p < 1.0 else None)
    eos = config._eos_token_tensor
    pad = config._pad_token_tensor
    return fast_generator(model, config, compile).generate(
        input_ids, max_new, attention_mask=attention_mask, sampling=sampling,
        eos_token_id=None if eos is None else eos.flatten().tolist(),
        pad_token_id=None if pad is None else int(pad), min_new_tokens=min_new, precision=precision,
        stop_check_every=stop_check_every)


def fast_generator(model, config: GenerationConfig, compile: bool | str | None = None) -> FastGenerator:
    """The model's FastGenerator for the config's compile settings (or `compile`), made once per
    setting and kept."""
    compile_config = config.compile_config
    if compile is None:
        compile = False if config.disable_compile else True if compile_config is not None else "auto"
    mode = backend = None
    if compile is True and compile_config is not None:
        mode, backend = compile_config.mode, compile_config.backend
    key = (compile, mode, backend)
    generators = model.__dict__.setdefault("_attnres_fast_generators", {})
    if key not in generators:
        generators[key] = FastGenerator(model.model, compile=compile, mode=mode, backend=backend or "inductor")
    return generators[key]


def _check_options(config: GenerationConfig) -> None:
    """InputError naming every option set away from transformers' default that the fast loop does not do."""
    reference = GenerationConfig()
    reference.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    expected = reference.to_dict()
    wrong = [key for key, value in config.to_dict().items()  # None, False and 0 all mean "off"
             if key not in HANDLED and key in expected and value != expected[key] and (value or expected[key])]
    if config.use_cache is False:
        wrong.append("use_cache")
    if wrong:
        raise InputError(f"generate with cache_implementation='static' (attnres's compiled decoding) does greedy "
                         f"and sampled decoding (do_sample, temperature, top_k, top_p, min_new_tokens, end tokens) "
                         f"only; these options are set: "
                         f"{ {key: getattr(config, key) for key in sorted(wrong)} }; leave them at their defaults, "
                         f"or drop cache_implementation for transformers' own loop")


def _max_new_tokens(model, config: GenerationConfig, kwargs: dict, given: GenerationConfig | None,
                    prompt: int) -> int:
    """New tokens to make, as transformers counts them: max_new_tokens, else max_length - prompt (the
    default max_length of 20 counts new tokens, capped at max_position_embeddings)."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    default_length = (kwargs.get("max_length") is None and (given is None or given.max_length is None)
                      and model.generation_config.max_length is None)
    if default_length:
        total = min(config.max_length + prompt, model.config.max_position_embeddings)
    else:
        total = config.max_length
    if total <= prompt:
        raise InputError(f"max_length={total} leaves no room after the prompt's {prompt} tokens; "
                         f"set max_new_tokens")
    return total - prompt
