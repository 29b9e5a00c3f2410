"""Fixed-length batches from a flat token stream: shuffled, resumable training batches; fixed eval batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnres.common.checks import check_int, is_int
from attnres.data.data_error import DataError


class TokenBatches:
    """Endless training batches of non-overlapping `seq_len` windows of `tokens`.

    Window i is tokens[i*seq_len : (i+1)*seq_len] (the trailing remainder is never used); the
    model shifts labels inside, so a window is both input and labels. Epoch e visits every window
    once, in a permutation drawn from a generator seeded by (seed, e); a batch that reaches the
    end of an epoch continues into the next. The position is two ints (`state_dict`), so a
    restored loader yields exactly the batches the original would have.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        check_int(seq_len, "seq_len", error=DataError)
        check_int(batch_size, "batch_size", error=DataError)
        if not is_int(seed) or seed < 0:
            raise DataError(f"TokenBatches: seed must be a non-negative integer, got {seed!r}")
        self._windows = _windows(tokens, seq_len, "training")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self._epoch, self._position = 0, 0
        self._order = self._permutation(0)

    @property
    def num_sequences(self) -> int:
        """Number of `seq_len` windows in one epoch."""
        return int(self._windows.shape[0])

    @property
    def epoch(self) -> int:
        """The epoch the next sequence comes from (0-based)."""
        return self._epoch

    def next_batch(self) -> torch.Tensor:
        """The next (batch_size, seq_len) int64 tensor of token ids."""
        rows = np.empty(self.batch_size, dtype=np.int64)
        for i in range(self.batch_size):
            if self._position == self.num_sequences:
                self._epoch, self._position = self._epoch + 1, 0
                self._order = self._permutation(self._epoch)
            rows[i] = self._order[self._position]
            self._position += 1
        return torch.from_numpy(self._windows[rows].astype(np.int64))

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "position"}: where the next batch starts (plain ints, JSON-safe)."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a position from `state_dict()` of a loader over the same tokens, seq_len and seed."""
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"TokenBatches.load_state_dict: expected {{'epoch': int, 'position': int}}, "
                            f"got {state!r}") from exc
        if epoch < 0 or not 0 <= position <= self.num_sequences:
            raise DataError(f"TokenBatches.load_state_dict: position must be in [0, {self.num_sequences}] and "
                            f"epoch >= 0, got {state!r} (was the state saved for other tokens or seq_len?)")
        self._epoch, self._position = epoch, position
        self._order = self._permutation(epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        return generator.permutation(self.num_sequences)


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int,
                 max_batches: int | None = None) -> list[torch.Tensor]:
    """Fixed evaluation batches: windows in stream order, (batch_size, seq_len) int64 each.

    The last partial batch is dropped; at most `max_batches` batches (None: all). Raises
    DataError when the stream holds less than one full batch.
    """
    check_int(seq_len, "seq_len", error=DataError)
    check_int(batch_size, "batch_size", error=DataError)
    if max_batches is not None:
        check_int(max_batches, "max_batches", error=DataError)
    windows = _windows(tokens, seq_len, "evaluation")
    count = windows.shape[0] // batch_size
    if count == 0:
        raise DataError(f"eval_batches: the evaluation stream has {len(tokens)} tokens = {windows.shape[0]} "
                        f"windows of seq_len={seq_len}, fewer than one batch of {batch_size}; lower batch_size "
                        "or seq_len, or raise val_fraction / max_documents")
    if max_batches is not None:
        count = min(count, max_batches)
    return [torch.from_numpy(windows[b * batch_size:(b + 1) * batch_size].astype(np.int64)) for b in range(count)]


def _windows(tokens: np.ndarray, seq_len: int, what: str) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise DataError(f"{what} tokens must be a 1-D array, got shape {tokens.shape}")
    count = tokens.shape[0] // seq_len
    if count == 0:
        raise DataError(f"the {what} stream has {tokens.shape[0]} tokens, shorter than one window of "
                        f"seq_len={seq_len}; use a smaller seq_len or more data")
    # A view, not a copy: `tokens` may be a memmap of a large cache file.
    return tokens[:count * seq_len].reshape(count, seq_len)
