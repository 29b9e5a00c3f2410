"""AttnResForCausalLM: an attnres model as a transformers PreTrainedModel (save/load, generate)."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, LinearAttentionLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from attnres.common.errors import InputError
from attnres.hf.configuration import AttnResConfig
from attnres.hf.fast_generation import generate_fast, static_cache_requested
from attnres.model import AttnResLM
from attnres.model.cache import KV_STATE
from attnres.generation.fast_generator import GenerationResult
from attnres.model.init_weights import init_module


class AttnResPreTrainedModel(PreTrainedModel):
    """Shared settings of attnres models in transformers."""

    config_class = AttnResConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _no_split_modules = ["DecoderLayer"]

    def _init_weights(self, module):
        # Called by transformers for modules it materialises without checkpoint values (routers
        # missing from a standard checkpoint, new embeddings): AttnResLM's own initialisation.
        init_module(module, self.config.initializer_range)


class AttnResForCausalLM(AttnResPreTrainedModel, GenerationMixin):
    """`model` is the attnres AttnResLM; parameter names are `model.<AttnResLM name>`."""

    def __init__(self, config: AttnResConfig) -> None:
        super().__init__(config)
        self.model = AttnResLM(config.to_model_config())
        if not any(p.is_meta for p in self.model.parameters()):
            # Built for real, AttnResLM initialised itself (init_module); marked so post_init does not
            # draw every weight a second time, and the same seed gives the same weights either way.
            # (from_pretrained builds on the meta device: there transformers initialises what the
            # checkpoint lacks through _init_weights.)
            for param in self.model.parameters():
                param._is_hf_initialized = True
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.lm_head.weight": "model.embed_tokens.weight"}
        self.post_init()

    def set_routing(self, impl: str = "auto", chunk_size: int | None = None) -> "AttnResForCausalLM":
        """How routing is computed, never what (`attnres.AttnResLM.set_routing`); not saved. Returns self."""
        self.model.set_routing(impl, chunk_size)
        return self

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache=None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, return_routing: bool = False, past_key_values=None,
                cache_position: torch.LongTensor | None = None, return_dict: bool | None = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0) -> CausalLMOutputWithPast:
        """input_ids (B, T) -> CausalLMOutputWithPast(loss, logits (B, T, V), cache).

        cache (transformers 5's name; `past_key_values` is accepted too): the KV cache of earlier
        positions. attention_mask (B, T_past + T), 1 = real token, 0 = padding: padded batches, left
        padded for `generate`, right padded for scoring, give every real token the logits of its
        sequence alone (see AttnResLM.forward). position_ids (B, T) or (1, T), as `generate` passes
        them, are used as given; `cache_position` is not needed (caches append in order) and ignored.
        Labels at padding should be -100. logits_to_keep > 0 returns the logits of the last that many
        positions only (the loss still covers every position). The other keywords transformers may
        pass are accepted where they ask for what this model does and refused by name where they do
        not (inputs_embeds, attentions, hidden states, a tuple output); a keyword it does not know,
        a misspelt one included, is a TypeError.
        """
        unsupported = {"inputs_embeds": inputs_embeds is not None, "output_attentions": bool(output_attentions),
                       "output_hidden_states": bool(output_hidden_states), "return_dict=False": return_dict is False}
        refused = [name for name, asked in unsupported.items() if asked]
        if refused:
            raise InputError(f"AttnResForCausalLM does not support {', '.join(refused)}: it takes input_ids and "
                             "returns logits, loss, the KV cache and, with return_routing=True, the routing weights")
        if input_ids is None:
            raise InputError("AttnResForCausalLM needs input_ids")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = self.new_cache()
        out = self.model(input_ids, labels=labels, return_routing=return_routing, cache=cache if use_cache else None,
                         attention_mask=attention_mask, position_ids=position_ids)
        logits = out.logits[:, -logits_to_keep:] if logits_to_keep else out.logits
        result = CausalLMOutputWithPast(loss=out.loss, logits=logits, cache=cache if use_cache else None)
        if return_routing:
            result["routing"] = out.routing
        return result

    def new_cache(self) -> DynamicCache:
        """An empty transformers DynamicCache with one layer per decoder layer, of the kind its token
        mixer keeps (`TokenMixer.cache_state`): keys and values, or a recurrent state. Built from the
        modules rather than from `config.layer_types`, which transformers maps to cache layers only
        for the layer types it knows (a registered token mixer's is not among them)."""
        layers = [DynamicLayer() if layer.self_attn.cache_state == KV_STATE else LinearAttentionLayer()
                  for layer in self.model.layers]
        cache = DynamicCache.__new__(DynamicCache)
        Cache.__init__(cache, layers=layers)
        return cache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        # transformers builds its default dynamic cache from config.layer_types; ours follows the
        # token mixers (new_cache). Any other cache implementation is transformers' own.
        wants_default = (model_kwargs.get("cache") is None and generation_config.use_cache is not False
                         and generation_config.cache_implementation in (None, "dynamic"))
        if not wants_default:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        model_kwargs["cache"] = self.new_cache()

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                 **kwargs):
        """transformers' `generate`; with `cache_implementation="static"` (a keyword, or set in the
        generation config), attnres's compiled static-cache decoding instead (`generate_fast`),
        returning the same (B, T + new) token ids. Its greedy output equals the plain call's."""
        if static_cache_requested(self, generation_config, kwargs):
            return self.generate_fast(inputs, generation_config, **kwargs).sequences
        return super().generate(inputs, generation_config, **kwargs)

    def generate_fast(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                      *, precision: str = "fp32", stop_check_every: int | None = None,
                      compile: bool | str | None = None, **kwargs) -> GenerationResult:
        """Generation with a static KV cache and one compiled decode step (docs/explanation/fast-paths.md).

        inputs (B, T) token ids, attention_mask (B, T) left-padded, and the generation options of
        `generate` (max_new_tokens, do_sample, temperature, top_k, top_p, min_new_tokens, eos/pad
        ids; disable_compile=True for the eager step, compile_config to compile with its backend and
        mode; otherwise the step is compiled only where that pays, `attnres.generation.compile_choice`);
        `compile` (True, False or "auto") overrides those; options it cannot honour are refused by
        name. precision: "fp32" or "bf16" (autocast).
        Returns a GenerationResult: `sequences` (B, T + new) long as `generate` returns them, and
        the prefill, compile and decode times and tokens/s.
        """
        kwargs.pop("cache_implementation", None)
        return generate_fast(self, inputs, generation_config, precision=precision,
                             stop_check_every=stop_check_every, compile=compile, **kwargs)
