"""Cross-stage source cache with a gradient mailbox, and the per-step P2P byte counter (method §5).

With V virtual stages per rank (interleaved schedules), rank r runs stages r, r + P, r + 2P, ...
A later stage on the rank needs every source (embedding, block summaries or deltas) that its
earlier stage already held, so those stay here per micro-batch instead of travelling again.

Gradients: the later stage uses a detached copy (its backward must not run into the earlier
stage's autograd graph, which the earlier stage's own backward frees later). `_Deposit` on that copy
puts the gradient into a mailbox; `_Tap`, an identity on the earlier stage's tensor, adds the mailbox
into the earlier stage's backward. Every schedule runs micro-batch m's backward of stage j + P
before that of stage j on the same rank (stage j's backward waits for the gradient that flows back
through j + P - 1, ..., j + 1), so the mailbox is full by the time the tap reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

Key = tuple[int, int]  # (micro-batch, source index)


class _Identity(torch.autograd.Function):
    """Identity in forward that remembers (cache, key) for a backward defined by the subclass."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, cache: "SourceCache", key: Key) -> torch.Tensor:
        ctx.cache, ctx.key = cache, key
        return tensor.view_as(tensor)


class _Tap(_Identity):
    """On the owning stage's source: backward adds what later stages deposited."""

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        extra = ctx.cache.collect(ctx.key)
        return (grad if extra is None else grad + extra), None, None


class _Deposit(_Identity):
    """On a later stage's detached copy: backward mails the gradient to the owner's tap."""

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.cache.deposit(ctx.key, grad)
        return None, None, None  # the copy is a throw-away leaf; nothing to accumulate there


class SourceCache:
    """One per rank, shared by its stages: sources by (micro-batch, index) and their mailbox."""

    def __init__(self) -> None:
        self._sources: dict[Key, torch.Tensor] = {}
        self._mailbox: dict[Key, torch.Tensor] = {}

    def reset(self) -> None:
        """Start a step. Raises if a deposited gradient was never collected (it would be lost)."""
        if self._mailbox:
            lost = sorted(self._mailbox)
            self._mailbox.clear()
            raise RuntimeError(f"cross-stage cache: gradients for (micro-batch, source) {lost} were deposited by a "
                               f"later stage but never added to the stage that owns the source")
        self._sources.clear()

    def keep(self, microbatch: int, index: int, source: torch.Tensor) -> torch.Tensor:
        """Hold `source` (B, T, D) for later stages on this rank; returns the tapped tensor that the
        owning stage must use from here on, so later stages' gradients reach its backward."""
        tapped = _Tap.apply(source, self, (microbatch, index)) if source.requires_grad else source
        self._sources[(microbatch, index)] = tapped
        return tapped

    def lookup(self, microbatch: int, count: int) -> list[torch.Tensor]:
        """Sources 0 .. count - 1 of `microbatch`, as detached copies whose gradient is mailed back."""
        out = []
        for index in range(count):
            key = (microbatch, index)
            if key not in self._sources:
                raise RuntimeError(f"cross-stage cache: source {index} of micro-batch {microbatch} was never "
                                   f"kept on this rank (layout and cache disagree)")
            held = self._sources[key]
            copy = held.detach().requires_grad_(held.requires_grad)
            out.append(_Deposit.apply(copy, self, key) if held.requires_grad else copy)
        return out

    def release(self, microbatch: int) -> None:
        """Drop `microbatch`'s sources once the rank's last stage has read them (mailbox stays)."""
        for key in [key for key in self._sources if key[0] == microbatch]:
            del self._sources[key]

    def deposit(self, key: Key, grad: torch.Tensor) -> None:
        """Add a later stage's gradient for source `key`."""
        held = self._mailbox.get(key)
        self._mailbox[key] = grad if held is None else held + grad

    def collect(self, key: Key) -> torch.Tensor | None:
        """Take the summed gradient deposited for `key`, or None if none was."""
        return self._mailbox.pop(key, None)

    def __len__(self) -> int:
        return len(self._sources)


@dataclass(frozen=True)
class PipelineBytes:
    """Bytes sent by P2P in one step, summed over ranks. `*_uncached` adds what the cache saved,
    i.e. what the same step sends with `cache=False`. Per-edge lists index transitions k -> k + 1."""

    forward_sent: int
    backward_sent: int
    forward_uncached: int
    backward_uncached: int
    forward_per_edge: tuple[int, ...]
    backward_per_edge: tuple[int, ...]


class ByteCounter:
    """Bytes of tensors handed to P2P sends per step, by direction and stage transition."""

    DIRECTIONS = ("forward", "backward")

    def __init__(self, num_edges: int, device: torch.device | str = "cpu") -> None:
        self.num_edges = num_edges
        self.device = torch.device(device)  # where `totals` all-reduces (CUDA for nccl groups)
        # [direction, kind (0 sent, 1 saved), edge]; int64 so totals can be all-reduced as one tensor
        self.counts = torch.zeros(2, 2, num_edges, dtype=torch.int64)

    def reset(self) -> None:
        """Start a step."""
        self.counts.zero_()

    def record(self, direction: str, edge: int, ops: list[dist.P2POp], saved: int) -> None:
        """Count the tensors of `ops` sent across `edge` and `saved` bytes the cache kept off it."""
        d = self.DIRECTIONS.index(direction)
        self.counts[d, 0, edge] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        self.counts[d, 1, edge] += saved

    def totals(self, group: dist.ProcessGroup | None = None) -> PipelineBytes:
        """This step's bytes summed over the ranks of `group` (a collective: every rank calls it);
        without an initialised process group, this rank's own counts."""
        counts = self.counts.to(self.device, copy=True)
        if dist.is_initialized():
            dist.all_reduce(counts, group=group)
        counts = counts.cpu()
        sent, saved = counts[:, 0], counts[:, 1]
        return PipelineBytes(
            forward_sent=int(sent[0].sum()), backward_sent=int(sent[1].sum()),
            forward_uncached=int((sent[0] + saved[0]).sum()), backward_uncached=int((sent[1] + saved[1]).sum()),
            forward_per_edge=tuple(int(v) for v in sent[0]), backward_per_edge=tuple(int(v) for v in sent[1]))
