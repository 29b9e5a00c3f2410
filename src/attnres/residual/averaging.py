"""The averaging scheme (mode "average", DenseFormer; method §7): after the layers a `StatePolicy`
names, the stream becomes a depth-weighted average of the states so far."""

from __future__ import annotations

import torch

from attnres.residual.policy import StatePolicy
from attnres.residual.scheme import ResidualScheme, StreamState


class AveragingScheme(ResidualScheme):
    """h_s = x_s; x_{s+1} = x_s + delta_s, and after layer t, when the policy names it, the stream
    becomes A_m(the states x_j it reads). One mixer per averaging layer (`StatePolicy.mixer_layers`),
    built with the number of sources it averages where the mixer asks (`takes_num_sources`)."""

    mode = "average"
    mixer_axis = "average (after layer)"
    policy: StatePolicy

    def build_mixers(self, mixer, hidden_size, eps, options):
        sizes = [len(self.policy.source_names(m)) for m in range(len(self.policy.mixer_layers))]
        return [mixer(hidden_size, eps, **options, **({"num_sources": n} if mixer.takes_num_sources else {}))
                for n in sizes]

    def _start(self, embedding: torch.Tensor, record_routing: bool) -> StreamState:
        return self.resume(embedding, [embedding], None, record_routing)

    def _after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        """Advance the stream; at a layer's end its output is a state, and an average may replace the stream."""
        state.stream = state.stream + delta
        if s % 2:
            layer = s // 2 + 1
            state.sources.append(state.stream)
            m = self.policy.mixer_after(layer)
            if m is not None:
                state.stream = self._call(m, [state.sources[j] for j in self.policy.state_indices(layer)], state)

    def source_names(self) -> list[list[str]]:
        return [self.policy.source_names(m) for m in range(self.num_routers)]

    def mixer_labels(self) -> list[str]:
        return [f"after {t}" for t in self.policy.mixer_layers]

    def stage_mixers(self, first_layer: int, last_layer: int, is_last: bool) -> list[int]:
        """The averages after this stage's layers."""
        return [m for m, t in enumerate(self.policy.mixer_layers) if first_layer < t <= last_layer]
