"""Pipeline configuration and the static stage layout: who owns which layers, what each transition carries.

torch.distributed.pipelining exchanges a tuple of tensors with shapes fixed when the stages are
built. Every transition's payload is known from the block layout alone, so it is fixed here:

    payload(k -> k+1) = [x_b]       (modes "none" and "add", and "replace" with an input-dependent query: the running stream)
                      + [partial]   (when a block spans the boundary)
                      + sources[first_sent : num_sources]

where b is the first sub-layer of stage k+1, num_sources = 1 + b // S completed sources (embedding
plus one per closed block of S sub-layers; none for `standard`), and with the cache first_sent is
the number of sources the receiving rank already holds: those of the end of its previous stage
k+1-P (P ranks; stages are placed round-robin, stage j on rank j % P). Without the cache, or for
the first stage on a rank, first_sent = 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from attnres.common.checks import check_bool, check_choice, check_int, is_int
from attnres.common.errors import InputError
from attnres.model.model_config import ModelConfig
from attnres.residual import build_residual

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")


class PipelineConfigError(InputError):
    """An invalid pipeline setting; the message names the field and the allowed values."""


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """How to cut the model into stages and run them (also the `train.pipeline` section of a run).

    schedule: one of `SCHEDULES`. stages_per_rank (V): 1 for "gpipe" and "1f1b"; any V >= 1 for
    "interleaved1f1b" (rank r runs stages r, r + P, ...). num_microbatches: micro-batches per step.
    layers_per_stage: decoder layers per stage in order, or None for an even split. Stage
    boundaries must fall on block boundaries unless allow_partial_blocks (then the current block's
    partial sum travels too). cache: send each source to a rank only once per micro-batch
    (method §5 cross-stage caching). Errors name fields as `<class name>.<field>`.
    """

    schedule: str = "1f1b"
    stages_per_rank: int = 1
    num_microbatches: int = 4
    cache: bool = True
    layers_per_stage: tuple[int, ...] | None = None
    allow_partial_blocks: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_choice(self.schedule, f"{owner}.schedule", SCHEDULES, error=PipelineConfigError)
        for name in ("stages_per_rank", "num_microbatches", "microbatch_size", "seq_len"):
            if hasattr(self, name):  # the last two are PipelineConfig's
                check_int(getattr(self, name), f"{owner}.{name}", error=PipelineConfigError)
        if self.schedule in SINGLE_STAGE_SCHEDULES and self.stages_per_rank != 1:
            raise PipelineConfigError(
                f"{owner}.stages_per_rank must be 1 for schedule={self.schedule!r} (one stage per rank); "
                f"use schedule='interleaved1f1b' for {self.stages_per_rank} virtual stages per rank")
        if self.layers_per_stage is not None:
            if not isinstance(self.layers_per_stage, (list, tuple)):
                raise PipelineConfigError(f"{owner}.layers_per_stage must be a list of layer counts (one per "
                                          f"stage) or null, got {self.layers_per_stage!r}")
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))  # YAML gives a list
        for name in ("allow_partial_blocks", "cache"):
            check_bool(getattr(self, name), f"{owner}.{name}", error=PipelineConfigError)

    def with_shapes(self, microbatch_size: int, seq_len: int) -> "PipelineConfig":
        """These settings with micro-batches of (microbatch_size, seq_len) tokens: what build_pipeline takes."""
        return PipelineConfig(**asdict(self), microbatch_size=microbatch_size, seq_len=seq_len)


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(PipelineSettings):
    """`PipelineSettings` plus the shapes that travel: a step's batch is num_microbatches x
    microbatch_size rows of seq_len tokens."""

    microbatch_size: int
    seq_len: int


@dataclass(frozen=True)
class Edge:
    """The payload of transition k -> k+1 (b = its first sub-layer in stage k+1)."""

    boundary: int          # b
    has_stream: bool
    has_partial: bool
    num_sources: int       # completed sources at b
    first_sent: int        # sources [0, first_sent) are already on the receiving rank

    @property
    def num_tensors(self) -> int:
        """Tensors (each (microbatch_size, seq_len, D)) that cross this transition."""
        return self.has_stream + self.has_partial + self.num_sources - self.first_sent


@dataclass(frozen=True)
class StageLayout:
    """The static split: stage j owns layers [layer_bounds[j], layer_bounds[j + 1]) and runs on rank
    j % num_ranks; edges[k] is the payload of transition k -> k+1."""

    num_ranks: int
    layer_bounds: tuple[int, ...]
    edges: tuple[Edge, ...]

    @property
    def num_stages(self) -> int:
        return len(self.layer_bounds) - 1

    def sublayers(self, stage: int) -> range:
        """Sub-layers run by `stage` (two per decoder layer)."""
        return range(2 * self.layer_bounds[stage], 2 * self.layer_bounds[stage + 1])

    def rank_of(self, stage: int) -> int:
        return stage % self.num_ranks

    def has_later_local_stage(self, stage: int) -> bool:
        """True when the same rank runs another stage after `stage` (which may read the cache)."""
        return stage + self.num_ranks < self.num_stages

    def bytes_per_step(self, tensor_bytes: int, num_microbatches: int) -> int:
        """Bytes sent in one direction per step: every micro-batch crosses every transition once,
        with one (b, T, D) tensor of `tensor_bytes` per payload entry (backward sends one gradient
        per tensor received, so both directions carry the same)."""
        return num_microbatches * tensor_bytes * sum(edge.num_tensors for edge in self.edges)


def build_layout(model: ModelConfig, config: PipelineConfig, num_ranks: int) -> StageLayout:
    """Validate `config` against the model and a pipeline group of `num_ranks` ranks; the layout."""
    if num_ranks < 2:
        raise PipelineConfigError(f"a pipeline needs at least 2 ranks in its process group, got {num_ranks}")
    num_stages = num_ranks * config.stages_per_rank
    if config.seq_len > model.max_seq_len:
        raise PipelineConfigError(f"PipelineConfig.seq_len={config.seq_len} exceeds ModelConfig.max_seq_len="
                                  f"{model.max_seq_len}")
    with torch.device("meta"):  # what the scheme keeps between sub-layers, without allocating its parameters
        scheme = build_residual(model.residual, model.residual_options, num_layers=model.num_layers,
                                hidden_size=model.hidden_size)
    if scheme.keeps_streams:
        raise PipelineConfigError(
            f"ModelConfig.residual={model.residual!r} keeps {scheme.policy.num_streams} residual streams (B, T, n, D) between "
            f"sub-layers; pipeline stages send (B, T, D) tensors and do not carry the streams yet. Train it "
            f"without a pipeline (data parallelism applies)")
    sizes = _layers_per_stage(model.num_layers, num_stages, config.layers_per_stage)
    bounds = tuple(sum(sizes[:j]) for j in range(num_stages + 1))
    keeps_stream = scheme.keeps_stream  # the running stream travels where the scheme keeps one
    # A source completes every `size` sub-layers (a state of DenseFormer at every layer's end, so
    # stages, which end at layers, never cut one).
    size = scheme.source_size
    has_sources = scheme.num_routers > 0
    if not config.allow_partial_blocks and size > 1:
        allowed = [layer for layer in range(1, model.num_layers) if (2 * layer) % size == 0]
        inside = [layer for layer in bounds[1:-1] if (2 * layer) % size]
        if inside:
            raise PipelineConfigError(
                f"PipelineConfig.layers_per_stage={sizes} puts stage boundaries at layers {inside}, inside a "
                f"block of {size} sub-layers ({model.variant}); "
                f"boundaries must be at layers {allowed}, or set PipelineConfig.allow_partial_blocks=True to "
                f"send the block's partial sum")

    def completed(b: int) -> int:  # sources complete before sub-layer b
        return 1 + b // size if has_sources else 0

    edges = []
    for k in range(num_stages - 1):
        b = 2 * bounds[k + 1]
        previous = k + 1 - num_ranks  # the receiving rank's earlier stage, if any
        first_sent = completed(2 * bounds[previous + 1]) if config.cache and previous >= 0 else 0
        edges.append(Edge(boundary=b, has_stream=keeps_stream,
                          has_partial=has_sources and b % size != 0,
                          num_sources=completed(b), first_sent=first_sent))
    return StageLayout(num_ranks=num_ranks, layer_bounds=bounds, edges=tuple(edges))


def _layers_per_stage(num_layers: int, num_stages: int, given: tuple[int, ...] | None) -> tuple[int, ...]:
    if num_stages > num_layers:
        raise PipelineConfigError(
            f"{num_stages} stages (ranks x PipelineConfig.stages_per_rank) need at least one layer each, but "
            f"ModelConfig.num_layers={num_layers}")
    if given is None:
        if num_layers % num_stages:
            raise PipelineConfigError(
                f"ModelConfig.num_layers={num_layers} does not split evenly into {num_stages} stages; give "
                f"PipelineConfig.layers_per_stage: {num_stages} positive integers summing to {num_layers}")
        return (num_layers // num_stages,) * num_stages
    if len(given) != num_stages or any(not is_int(n) or n < 1 for n in given) \
            or sum(given) != num_layers:
        raise PipelineConfigError(
            f"PipelineConfig.layers_per_stage must be {num_stages} positive integers (one per stage) summing to "
            f"ModelConfig.num_layers={num_layers}, got {given}")
    return given


def tensor_bytes(model: ModelConfig, config: PipelineConfig, itemsize: int) -> int:
    """Bytes of one travelling tensor: (microbatch_size, seq_len, hidden_size) elements."""
    return math.prod((config.microbatch_size, config.seq_len, model.hidden_size)) * itemsize
