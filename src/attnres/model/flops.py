"""FLOPs accounting: training FLOPs per token of any ModelConfig, every variant (docs/explanation/scaling-law.md).

Counted as 2 FLOPs per multiply-add of a contraction, forward; training is three times the forward
(backward computes the gradients of inputs and of weights, each a contraction of the forward's
size). Per token of a T-token sequence, with L layers, D hidden, H query heads and K KV heads of
size d_h, F the FFN width and V the vocabulary:

    linear     = 2 L (2 D H d_h + 2 D K d_h + 3 D F)     q, o; k, v; gate, up, down (a mixture of
                                                         experts: its router and k experts of width F)
    attention  = 4 L T H d_h                             Q K^T and A V over all T keys
                                                         (latent attention: 2 T H (d_qk + d_v) per
                                                         layer; Kimi Delta Attention: 6 H d_k d_v for
                                                         the delta rule's state read, update and
                                                         output, plus 2 K x 3 H d_k for the short
                                                         convolutions, per layer, whatever T)
    head       = 2 D V                                   the LM head (tied or not)
    mixing     = sum over the model's depth mixers of `DepthMixer.flops_per_token(n_sources)`

Attention counts the full T x T score matrix, as PyTorch's math kernel computes it (and as Kaplan
et al. and Chinchilla count); a causal kernel that skips the masked half does about half of it.
Not counted, in the decoder as in the mixers: norms, rotary embedding, activations, softmax,
residual adds and the embedding lookup (elementwise work, a few FLOPs per value).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from attnres.common.errors import InputError
from attnres.model.model_config import ModelConfig
from attnres.model.decoder import AttnResLM

TRAINING_MULTIPLIER = 3  # forward + backward (input and weight gradients)


@dataclass(frozen=True)
class FlopsPerToken:
    """Forward FLOPs per token by component; `training` is TRAINING_MULTIPLIER times `forward`.

    linear: the decoder layers' projections; attention: the sequence term (QK^T, AV); head: the LM
    head; mixing_matmul / mixing_vector: the depth mixers' contractions computed as matrix products
    and elementwise (`attnres.methods.MixerFlops`). `counted_by_torch`: what torch's FlopCounterMode
    sees of the forward (every matrix product, with attention under the math kernel).
    """

    linear: int
    attention: int
    head: int
    mixing_matmul: int
    mixing_vector: int

    @property
    def mixing(self) -> int:
        return self.mixing_matmul + self.mixing_vector

    @property
    def forward(self) -> int:
        return self.linear + self.attention + self.head + self.mixing

    @property
    def training(self) -> int:
        return TRAINING_MULTIPLIER * self.forward

    @property
    def counted_by_torch(self) -> int:
        return self.linear + self.attention + self.head + self.mixing_matmul

    def to_dict(self) -> dict:
        """Every component and the totals (forward, training) as plain numbers."""
        return {**asdict(self), "mixing": self.mixing, "forward": self.forward, "training": self.training}


def _linear_flops(module: nn.Module) -> int:
    """2 in x out per token for every nn.Linear inside `module` (bias adds are not counted)."""
    return sum(2 * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopsPerToken:
    """FLOPs per token of `config` on sequences of `seq_len` tokens (default config.max_seq_len).

    Built on the meta device (no memory, any size): the projections are read off the decoder's
    nn.Linear modules, the sequence term off each token mixer (`TokenMixer.flops_per_token`) and the
    mixing off the residual scheme's mixers with their source counts, so the count follows the code.
    Raises InputError for a seq_len below 1.
    """
    seq_len = config.max_seq_len if seq_len is None else seq_len
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise InputError(f"seq_len must be a positive integer, got {seq_len!r}")
    with torch.device("meta"):
        model = AttnResLM(config)
    mixers = list(model.routers) if model.routers is not None else []
    sources = model.residual.source_names()
    matmul = vector = 0
    for mixer, names in zip(mixers, sources, strict=True):
        cost = mixer.flops_per_token(len(names))
        matmul, vector = matmul + cost.matmul, vector + cost.vector
    return FlopsPerToken(
        linear=sum(_linear_flops(layer.self_attn) + layer.mlp.flops_per_token() for layer in model.layers),
        attention=sum(layer.self_attn.flops_per_token(seq_len) for layer in model.layers),
        head=2 * config.hidden_size * config.vocab_size,
        mixing_matmul=matmul, mixing_vector=vector)


def training_flops(config: ModelConfig, tokens: int, seq_len: int | None = None) -> int:
    """Training FLOPs of `tokens` tokens on sequences of `seq_len` (`flops_per_token(...).training * tokens`)."""
    return flops_per_token(config, seq_len).training * tokens


@dataclass(frozen=True)
class ParameterCount:
    """A model's parameters: `total`, and `non_embedding` (without the token embedding and an untied
    LM head: the count Kaplan et al.'s scaling laws use, which the embedding's size does not blur)."""

    total: int
    non_embedding: int


def parameter_count(config: ModelConfig) -> ParameterCount:
    """The parameters of `config`, counted on the meta device (no memory, any size); tied weights once."""
    with torch.device("meta"):
        model = AttnResLM(config)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    embedding = model.embed_tokens.weight.numel()
    head = 0 if config.tie_embeddings else model.lm_head.weight.numel()
    return ParameterCount(total=total, non_embedding=total - embedding - head)
