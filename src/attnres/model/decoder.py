"""AttnResLM: a Qwen3-architecture decoder whose residual connections are a pluggable scheme."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnres.model.config import ModelConfig
from attnres.model.init import init_module
from attnres.model.layers import DecoderLayer, RotaryEmbedding
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
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.residual: ResidualScheme = build_residual(
            config.residual, num_layers=config.num_layers, hidden_size=config.hidden_size,
            num_blocks=config.num_blocks, exact_conversion=config.exact_conversion, eps=config.norm_eps,
            routing_impl=config.routing_impl)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def routers(self) -> nn.ModuleList:
        """The depth mixers (routers) in sub-layer order, the final one last where the variant has one."""
        return self.residual.routers

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
                return_routing: bool = False, cache=None) -> CausalLMOutput:
        """input_ids (B, T) int -> CausalLMOutput.

        labels (B, T): next-token targets, shifted inside (position t predicts labels[t + 1]);
        -100 is ignored. With return_routing, `routing` is a list with one (B, T, n_sources) fp32
        tensor of softmax weights per router, in the order of `self.routers`. cache: a KVCache (or a
        Hugging Face Cache) holding earlier positions; input_ids are then the next positions, and the
        cache is updated in place and returned as `out.cache`.
        """
        past = cache.get_seq_length() if cache is not None else 0
        self._check_input_ids(input_ids, past)
        positions = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        embedding = self.embed_tokens(input_ids)
        rope = self.rotary(positions, embedding.dtype)
        state = self.residual.start(embedding, record_routing=return_routing)
        self.run_sublayers(state, 0, self.config.num_sublayers, rope, cache)
        logits = self.output_logits(state)
        loss = None if labels is None else next_token_loss(logits, labels)
        return CausalLMOutput(logits=logits, loss=loss, routing=state.routing, cache=cache)

    def run_sublayers(self, state: StreamState, start: int, stop: int, rope: tuple[torch.Tensor, torch.Tensor],
                      cache=None) -> StreamState:
        """Advance `state` through sub-layers start .. stop - 1 (even = attention, odd = MLP) in place.

        The one loop over sub-layers: `forward` runs all 2L, a pipeline stage runs its own range on
        a state rebuilt from what it received. rope: (cos, sin), each (T, head_dim).
        """
        for s in range(start, stop):
            i = s // 2
            layer = self.layers[i]
            h = self.residual.sublayer_input(s, state)
            if s % 2 == 0:
                delta = self._sublayer(layer.attention_delta, h, rope, cache, i)
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
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        if past + input_ids.shape[1] > self.config.max_seq_len:
            raise ValueError(f"input_ids has seq_len {input_ids.shape[1]} after {past} cached positions, longer "
                             f"than the configured maximum ModelConfig.max_seq_len={self.config.max_seq_len}")
        if torch.compiler.is_compiling() or input_ids.numel() == 0:
            return  # the range check reads values back; compiled graphs skip it
        if past and input_ids.device.type != "cpu":
            return  # reading ids back from an accelerator stalls it: checked on the first call only
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(f"input_ids must be token ids in [0, vocab_size={self.config.vocab_size}), "
                             f"got values from {low} to {high}")


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[:, t] against labels[:, t + 1], fp32, ignoring -100.

    logits (B, T, V), labels (B, T) -> scalar.
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels must have shape {tuple(logits.shape[:2])} like input_ids, got {tuple(labels.shape)}")
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)

