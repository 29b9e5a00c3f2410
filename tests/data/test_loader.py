"""TokenBatches and eval_batches: windows, determinism, exact resumption, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnres.data import DataError, TokenBatches, eval_batches

TOKENS = np.arange(1000, dtype=np.uint16)  # 1000 // 8 = 125 windows, token value = position


def take(loader, count):
    return [loader.next_batch() for _ in range(count)]


def test_batches_are_windows_of_the_stream():
    loader = TokenBatches(TOKENS, seq_len=8, batch_size=5, seed=0)
    assert loader.num_sequences == 125
    batch = loader.next_batch()
    assert batch.dtype == torch.int64 and batch.shape == (5, 8)
    starts = batch[:, 0]
    assert torch.all(starts % 8 == 0)
    assert torch.equal(batch, starts[:, None] + torch.arange(8))


def test_one_epoch_visits_every_window_once():
    loader = TokenBatches(TOKENS, seq_len=8, batch_size=25, seed=3)
    starts = torch.cat([b[:, 0] for b in take(loader, 5)])
    assert sorted(starts.tolist()) == list(range(0, 1000, 8))
    assert starts.tolist() != list(range(0, 1000, 8))  # shuffled
    assert loader.state_dict() == {"epoch": 0, "position": 125}
    loader.next_batch()
    assert loader.state_dict() == {"epoch": 1, "position": 25}


def test_deterministic_for_a_seed_and_epochs_differ():
    a = take(TokenBatches(TOKENS, 8, 25, seed=1), 10)
    b = take(TokenBatches(TOKENS, 8, 25, seed=1), 10)
    c = take(TokenBatches(TOKENS, 8, 25, seed=2), 10)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert not torch.equal(torch.cat(a[:5]), torch.cat(a[5:]))  # epoch 1 is a new permutation


@pytest.mark.parametrize("stop", [0, 3, 5, 7, 12])
def test_restore_continues_exactly_across_epoch_boundaries(stop):
    # 125 windows in batches of 12: batches 10 and 20 straddle epoch boundaries.
    reference = take(TokenBatches(TOKENS, 8, 12, seed=9), 30)
    interrupted = TokenBatches(TOKENS, 8, 12, seed=9)
    take(interrupted, stop)
    state = json.loads(json.dumps(interrupted.state_dict()))  # survives a JSON checkpoint
    resumed = TokenBatches(TOKENS, 8, 12, seed=9)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(take(resumed, 30 - stop), reference[stop:]))


def test_batch_larger_than_epoch_wraps():
    loader = TokenBatches(np.arange(20), seq_len=5, batch_size=6, seed=0)
    starts = loader.next_batch()[:, 0].tolist()
    assert sorted(starts[:4]) == [0, 5, 10, 15] and loader.state_dict() == {"epoch": 1, "position": 2}


def test_errors():
    with pytest.raises(DataError, match="has 7 tokens, shorter than one window of seq_len=8"):
        TokenBatches(np.arange(7), 8, 2, seed=0)
    with pytest.raises(DataError, match="seq_len must be a positive integer"):
        TokenBatches(TOKENS, 0, 2, seed=0)
    with pytest.raises(DataError, match="seed must be a non-negative integer"):
        TokenBatches(TOKENS, 8, 2, seed=-1)
    loader = TokenBatches(TOKENS, 8, 2, seed=0)
    with pytest.raises(DataError, match="position must be in"):
        loader.load_state_dict({"epoch": 0, "position": 126})
    with pytest.raises(DataError, match="expected"):
        loader.load_state_dict({"epoch": 0})


def test_eval_batches_fixed_in_order_partial_dropped():
    batches = eval_batches(TOKENS, seq_len=8, batch_size=10, max_batches=None)
    assert len(batches) == 12  # 125 windows -> 12 full batches, 5 windows dropped
    assert torch.equal(torch.cat(batches).flatten(), torch.arange(960))
    assert batches[0].dtype == torch.int64
    assert len(eval_batches(TOKENS, 8, 10, max_batches=3)) == 3
    assert all(torch.equal(x, y) for x, y in zip(eval_batches(TOKENS, 8, 10, 3), batches))
    with pytest.raises(DataError, match="1000 tokens = 125 windows of seq_len=8, fewer than one batch of 200"):
        eval_batches(TOKENS, 8, 200, None)
    with pytest.raises(DataError, match="shorter than one window"):
        eval_batches(np.arange(3), 8, 1, None)
