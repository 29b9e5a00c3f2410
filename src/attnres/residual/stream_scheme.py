"""The stream scheme (mode "streams", hyper-connections and mHC; method §7.3): n residual streams
(B, T, n, D) that every sub-layer's mixer reads its input from and writes its output back into."""

from __future__ import annotations

import torch

from attnres.residual.policy import StreamPolicy
from attnres.residual.scheme import ResidualScheme, StreamState


class StreamScheme(ResidualScheme):
    """X starts as n copies of the embedding; h_s = R_s(X) (a read, which also computes the write
    coefficients), X <- R_s.write(X, delta_s); hidden = R_final(X). Mixers are built as
    mixer(hidden_size, eps, num_streams=n, index=s, **options) per sub-layer, `mixer.final(...)` last.
    Any impl but "reference" takes the stream mixers' lean path (no normalised copy of the streams,
    docs/explanation/contenders.md). The mixers compute in at least fp32; the streams, the sub-layers'
    inputs and the hidden state stay in the embedding's dtype (fp32 under autocast, bf16 for a model
    whose weights are bf16), as the standard residual does."""

    mode = "streams"
    policy: StreamPolicy
    needs_input_read = True  # the read computes the write coefficients `after` uses

    def build_mixers(self, mixer, hidden_size, eps, options):
        if not mixer.mixes_streams:
            raise ValueError("mode 'streams' takes a stream mixer (mixes_streams)")
        n = self.policy.num_streams
        return [*(mixer(hidden_size, eps, num_streams=n, index=s, **options) for s in range(self.num_sublayers)),
                mixer.final(hidden_size, eps, num_streams=n, **options)]

    def _start(self, embedding: torch.Tensor, record_routing: bool) -> StreamState:
        n = self.policy.num_streams
        return self.resume(embedding.unsqueeze(-2).expand(*embedding.shape[:-1], n, embedding.shape[-1]), [], None,
                           record_routing)

    def resume(self, stream, sources, partial, record_routing=False) -> StreamState:
        """The streams (B, T, n, D) as `stream`; no sources, no partial."""
        if stream.dim() != 4:
            raise ValueError(f"mode 'streams' resumes from the streams (B, T, n, D), got shape {tuple(stream.shape)}")
        return super().resume(stream, sources, partial, record_routing)

    def _sublayer_input(self, s: int, state: StreamState) -> torch.Tensor:
        state.scratch = []  # the read's write coefficients, for `after`
        h = self._call(s, state.stream, state, lean=state.impl != "reference", written=state.scratch)
        return h.to(state.stream.dtype)

    def _after(self, s: int, state: StreamState, delta: torch.Tensor) -> None:
        state.stream = self.routers[s].write(state.stream, delta, state.scratch[0]).to(state.stream.dtype)
        state.scratch = None

    def _finish(self, state: StreamState) -> torch.Tensor:
        hidden = self._call(self.num_routers - 1, state.stream, state, lean=state.impl != "reference")
        return hidden.to(state.stream.dtype)

    @property
    def keeps_stream(self) -> bool:
        return False

    @property
    def keeps_streams(self) -> bool:
        return True

    def source_names(self) -> list[list[str]]:
        return [self.policy.source_names(m) for m in range(self.num_routers)]

    def split_sources(self, mixer_input) -> list[torch.Tensor]:
        """The n streams of a (B, T, n, D) mixer input."""
        return list(mixer_input.unbind(-2))

    def join_sources(self, sources: list[torch.Tensor]):
        return torch.stack(sources, dim=-2)
