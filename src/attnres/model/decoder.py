"""AttnResLM: a Qwen3-architecture decoder whose residual connections are a pluggable scheme."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnres.common.errors import InputError
from attnres.model.cache import KV_STATE, cached_length
from attnres.model.model_config import AUTO_VOCAB, ConfigError, ModelConfig
from attnres.model.init_weights import init_module
from attnres.model.layers import DecoderLayer, RotaryEmbedding, padded_causal_mask, padded_positions
from attnres.norm import RMSNorm
from attnres.residual import ResidualScheme, StreamState, build_residual


@dataclass
class CausalLMOutput:
    """logits (B, T, V); loss (scalar) when labels were given; routing when asked; the cache passed in."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    routing: list[torch.Tensor] | None = None
    cache: object | None = None


class AttnResLM(nn.Module):
    """Decoder-only language model: embed, 2L pre-norm sub-layers joined by `residual`, norm, head.

    The loop over sub-layers is written once; `self.residual` (a ResidualScheme) decides each
    sub-layer's input and records its output. Sub-layer parameter names do not depend on the
    variant, so a `standard` state dict loads into any variant with `strict=False`, leaving only
    `residual.routers.*` missing.

    `activation_checkpointing = True` recomputes each sub-layer's activations in backward (while
    training); routing keeps only per-token scalars anyway, so only the sub-layers are wrapped.
    """

    activation_checkpointing: bool = False

    def __init__(self, config: ModelConfig) -> None:
        if not isinstance(config, ModelConfig):
            raise InputError(f"AttnResLM takes a ModelConfig, got {type(config).__name__}; build one with "
                             f"ModelConfig(**fields) or ModelConfig.from_dict(values)")
        if config.vocab_size == AUTO_VOCAB:
            raise ConfigError(f"ModelConfig.vocab_size is {AUTO_VOCAB!r}, a vocabulary not yet known: resolve it "
                              f"with config.with_vocab_size(n) (a run does, once its tokenizer is read)")
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        # A cache's length is read from a layer that caches keys and values: a recurrent state holds no positions.
        self.first_attention_layer = next(i for i, layer in enumerate(self.layers)
                                          if layer.self_attn.cache_state == KV_STATE)
        self.residual: ResidualScheme = build_residual(
            config.residual, config.residual_options, num_layers=config.num_layers, hidden_size=config.hidden_size,
            eps=config.norm_eps, init_std=config.init_std)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def routers(self) -> nn.ModuleList:
        """The depth mixers (routers) in sub-layer order, the final one last where the variant has one."""
        return self.residual.routers

    def set_routing(self, impl: str = "auto", chunk_size: int | None = None) -> "AttnResLM":
        """Choose how routing is computed, never what (`ResidualScheme.set_routing`): the routing
        implementation (one of `attnres.routing.IMPLS` that the variant takes) and the chunk size of
        per-sub-layer two-phase routing (None: automatic). Not part of the model or its checkpoints;
        a new model starts with "auto". Returns the model."""
        self.residual.set_routing(impl, chunk_size)
        return self

    def routing_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of every routing parameter (the depth mixers'), named as in named_parameters().

        The one place that says which parameters are routing parameters: the optimizer's routing
        group, conversion and `init_from` (which may leave exactly these missing) use it."""
        return list(self.residual.named_parameters(prefix="residual"))

    def reset_parameters(self) -> None:
        """Every module by `init_module`: linear and embedding weights N(0, init_std), biases and
        queries and gates zero, norm gains one."""
        for module in self.modules():
            init_module(module, self.config.init_std)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                return_routing: bool = False, cache=None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> CausalLMOutput:
        """input_ids (B, T) int -> CausalLMOutput.

        labels (B, T): next-token targets, shifted inside (position t predicts labels[t + 1]);
        -100 is ignored. With return_routing, `routing` is a list with one (B, T, n_sources) fp32
        tensor of softmax weights per router, in the order of `self.routers`. cache: a KVCache (or a
        Hugging Face Cache) holding earlier positions; input_ids are then the next positions, and the
        cache is updated in place and returned as `out.cache`.

        attention_mask (B, T_past + T), bool or integer, 1 = real token, 0 = padding, covering the
        cached positions and the new ones (as transformers' `generate` extends it): left padding
        (generation) and right padding (scoring) both work. A real token's rotary position is the
        number of real tokens before it and no real token attends to a pad, so every real token's
        logits and routing are those of its sequence run alone; a pad's own outputs are finite and
        meaningless, and the loss counts a target only where it and the token predicting it are
        both real (a left pad never predicts the first token). position_ids (B, T) or (1, T): rotary
        positions of the new tokens, used instead of those from the mask (transformers' `generate`
        passes them). Without a mask, or with an all-ones one seen on a first call, the fast causal
        path runs and no mask is built.
        """
        past = cached_length(cache, self.first_attention_layer)
        self._check_input_ids(input_ids, past)
        attention_mask = self._padding_mask(attention_mask, input_ids, past)
        new = input_ids.shape[1]
        if position_ids is not None:
            self._check_position_ids(position_ids, input_ids)
            positions = position_ids[:, None]  # (B or 1, 1, T): one rotary table per row, shared by the heads
        elif attention_mask is not None:
            positions = padded_positions(attention_mask, new)[:, None]
        else:
            positions = torch.arange(past, past + new, device=input_ids.device)
        mask = None if attention_mask is None else padded_causal_mask(attention_mask, new)
        embedding = self.embed_tokens(input_ids)
        rope = self.rotary(positions, embedding.dtype)
        state = self.residual.start(embedding, record_routing=return_routing)
        real = None if attention_mask is None else attention_mask[:, past:].bool()
        self.run_sublayers(state, 0, self.config.num_sublayers, rope, cache, mask, real)
        logits = self.output_logits(state)
        if labels is not None:
            _check_ids(labels, "labels", shape=tuple(input_ids.shape))
        if labels is not None and attention_mask is not None:
            labels = _labels_of_real_tokens(labels, attention_mask[:, past:])
        loss = None if labels is None else next_token_loss(logits, labels)
        return CausalLMOutput(logits=logits, loss=loss, routing=state.routing, cache=cache)

    def run_sublayers(self, state: StreamState, start: int, stop: int, rope: tuple[torch.Tensor, torch.Tensor],
                      cache=None, mask: torch.Tensor | None = None, real: torch.Tensor | None = None) -> StreamState:
        """Advance `state` through sub-layers start .. stop - 1 (even = attention, odd = MLP) in place.

        The one loop over sub-layers: `forward` runs all 2L, a pipeline stage runs its own range on
        a state rebuilt from what it received. rope: (cos, sin), each (T, head_dim) or, per row,
        (B, 1, T, head_dim). mask: None (causal) or the (B, 1, T, T_past + T) boolean attention mask
        of a padded batch (`layers.padded_causal_mask`); only attention reads it, routing is per token.
        real: None, or (B, T) bool, the new positions that are real tokens (linear-attention layers
        zero the pads' inputs instead of masking).
        """
        for s in range(start, stop):
            i = s // 2
            layer = self.layers[i]
            h = self.residual.sublayer_input(s, state)
            if s % 2 == 0:
                delta = self._sublayer(layer.attention_delta, h, rope, cache, i, mask, real)
            else:
                delta = self._sublayer(layer.mlp_delta, h)
            self.residual.after(s, state, delta)
        return state

    def output_logits(self, state: StreamState) -> torch.Tensor:
        """Logits (B, T, V) from the state after the last sub-layer: final router (if any), norm, head."""
        return self.lm_head(self.norm(self.residual.finish(state)))

    def _sublayer(self, function, *args):
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(function, *args, use_reentrant=False)
        return function(*args)

    def _check_input_ids(self, input_ids: torch.Tensor, past: int) -> None:
        _check_ids(input_ids, "input_ids")
        if past + input_ids.shape[1] > self.config.max_seq_len:
            raise InputError(f"input_ids has seq_len {input_ids.shape[1]} after {past} cached positions, longer "
                             f"than the configured maximum ModelConfig.max_seq_len={self.config.max_seq_len}")
        if not _may_read_back(input_ids, past):
            return
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise InputError(f"input_ids must be token ids in [0, vocab_size={self.config.vocab_size}), "
                             f"got values from {low} to {high}")

    @staticmethod
    def _padding_mask(attention_mask: torch.Tensor | None, input_ids: torch.Tensor, past: int) -> torch.Tensor | None:
        """The checked attention_mask (B, T_past + T), or None where it is seen to be all ones (no padding)."""
        if attention_mask is None:
            return None
        expected = (input_ids.shape[0], past + input_ids.shape[1])
        if tuple(attention_mask.shape) != expected:
            raise InputError(f"attention_mask must have shape (batch, cached + new positions) = {expected}, "
                             f"1 = real token and 0 = padding, got {tuple(attention_mask.shape)}")
        if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
            raise InputError(f"attention_mask must be a bool or integer tensor of shape {expected} "
                             f"(1 = real token, 0 = padding), got dtype {attention_mask.dtype}")
        if not _may_read_back(attention_mask, past):
            return attention_mask
        low, high = torch.stack(attention_mask.long().aminmax()).tolist()  # one read-back for both checks
        if low < 0 or high > 1:
            raise InputError(f"attention_mask must hold 1 (real token) and 0 (padding), "
                             f"got values from {low} to {high}")
        # All ones is no padding: drop the mask so attention keeps is_causal SDPA (flash kernels).
        return None if low == 1 else attention_mask

    @staticmethod
    def _check_position_ids(position_ids: torch.Tensor, input_ids: torch.Tensor) -> None:
        b, t = input_ids.shape
        if position_ids.dim() != 2 or position_ids.shape[0] not in (1, b) or position_ids.shape[1] != t:
            raise InputError(f"position_ids must have shape ({b}, {t}) or (1, {t}) like input_ids, "
                             f"got {tuple(position_ids.shape)}")
        if position_ids.dtype.is_floating_point or position_ids.dtype.is_complex or position_ids.dtype == torch.bool:
            raise InputError(f"position_ids must be an integer tensor, got dtype {position_ids.dtype}")


def _may_read_back(tensor: torch.Tensor, past: int) -> bool:
    """Whether a check may read `tensor`'s values back to the host.

    Not while compiling (a graph break), not for an empty tensor, and on an accelerator only on a
    sequence's first call (no cached positions): one read-back per prompt is negligible, while one
    per decoded token would stall the device every step. On the CPU reading back costs nothing.
    """
    if torch.compiler.is_compiling() or tensor.numel() == 0:
        return False
    return past == 0 or tensor.device.type == "cpu"


def _labels_of_real_tokens(labels: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """labels (B, T) with -100 wherever the target or the token predicting it (at t - 1) is padding
    (real (B, T) == 0), so nothing is learnt from a pad's output or about a pad. Labels of another
    shape are returned as they are, for next_token_loss to refuse with its message."""
    if labels.shape != real.shape:
        return labels
    real = real.bool()
    predicted_from_real = torch.cat([real[:, :1], real[:, :-1]], dim=1)  # column 0 is never a target
    return labels.masked_fill(~(real & predicted_from_real), -100)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[:, t] against labels[:, t + 1], fp32, ignoring -100.

    logits (B, T, V), labels (B, T) -> scalar.
    """
    if labels.shape != logits.shape[:2]:
        raise InputError(f"labels must have shape {tuple(logits.shape[:2])} like input_ids, got {tuple(labels.shape)}")
    try:
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
    except IndexError:  # CPU's refusal of a target outside [0, V) (CUDA asserts on the device instead)
        vocab = logits.shape[-1]
        outside = labels[(labels != -100) & ((labels < 0) | (labels >= vocab))]
        if outside.numel() == 0:
            raise
        raise InputError(f"labels must be token ids in [0, {vocab}) (the model's vocab_size) or -100 (ignored); "
                         f"got {outside[0].item()} among {outside.numel()} outside that range") from None


def _check_ids(ids: object, name: str, shape: tuple[int, ...] | None = None) -> None:
    """InputError unless `ids` is a (batch, seq_len) integer tensor (of `shape`): torch.long, or torch.int32
    for input_ids."""
    if not isinstance(ids, torch.Tensor):
        raise InputError(f"{name} must be a torch tensor of shape (batch, seq_len) and dtype torch.long, got a "
                         f"{type(ids).__name__}; use torch.tensor(ids, dtype=torch.long)")
    if ids.dim() != 2 or (shape is not None and tuple(ids.shape) != shape):
        wanted = "(batch, seq_len)" if shape is None else f"{shape}, that of input_ids"
        raise InputError(f"{name} must have shape {wanted}, got {tuple(ids.shape)}")
    allowed = (torch.long,) if name == "labels" else (torch.long, torch.int32)  # cross entropy takes long targets
    if ids.dtype not in allowed:
        raise InputError(f"{name} must be token ids of dtype {' or '.join(map(str, allowed))}, got {ids.dtype}; "
                         f"convert them with .long()")
