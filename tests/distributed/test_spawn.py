"""tests/distributed/spawn.py, the harness of every multi-process test: a rank that dies before it
reports is retried once and said so; a failed body is reported with its traceback and never retried."""

import os
from pathlib import Path

import pytest

from tests.distributed.spawn import run_workers


def _attempt(folder: str, rank: int) -> int:
    """Count this rank's attempts in `folder` (one file per attempt); the attempt's number, from 1."""
    done = len(list(Path(folder).glob(f"rank{rank}.*")))
    Path(folder, f"rank{rank}.{done + 1}").touch()
    return done + 1


def _dies_on_first_attempt(rank: int, world_size: int, folder: str) -> None:
    if _attempt(folder, rank) == 1 and rank == 1:
        os.abort()  # as gloo's "terminate called without an active exception" does: SIGABRT, no report


def _always_dies(rank: int, world_size: int, folder: str) -> None:
    _attempt(folder, rank)
    if rank == 0:
        os._exit(3)


def _fails_an_assertion(rank: int, world_size: int, folder: str) -> None:
    _attempt(folder, rank)
    assert rank == 0, "rank 1 sees something wrong"


def _sums_ranks(rank: int, world_size: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    Path(folder, f"sum{rank}").write_text(str(int(total.item())))


def test_ranks_run_in_one_process_group(tmp_path):
    run_workers(_sums_ranks, 2, str(tmp_path))
    assert [(tmp_path / f"sum{r}").read_text() for r in range(2)] == ["3", "3"]


def test_a_rank_that_dies_before_it_reports_is_retried_once_after_reset(tmp_path):
    resets = []
    with pytest.warns(RuntimeWarning, match=r"died before reporting: rank 1 \(exit code -6\); retrying the spawn "
                                            r"once \(a launcher failure, not a failed assertion\)"):
        run_workers(_dies_on_first_attempt, 2, str(tmp_path), reset=lambda: resets.append(True))
    assert resets == [True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.1", "rank0.2", "rank1.1", "rank1.2"]


def test_a_launch_that_fails_twice_is_an_error(tmp_path):
    with pytest.warns(RuntimeWarning, match="retrying the spawn once"):
        with pytest.raises(AssertionError, match=r"distributed launch failed twice: died before reporting: "
                                                 r"rank 0 \(exit code 3\)"):
            run_workers(_always_dies, 2, str(tmp_path))
    assert len(list(tmp_path.glob("rank0.*"))) == 2  # two attempts, no third


def test_a_failed_assertion_is_reported_with_its_traceback_and_never_retried(tmp_path):
    with pytest.raises(AssertionError, match=r"(?s)distributed worker failed:\nrank 1:\nTraceback.*"
                                             r"AssertionError: rank 1 sees something wrong"):
        run_workers(_fails_an_assertion, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.1", "rank1.1"]
