"""A real torch.distributed run: two gloo ranks on CPU, each with two DataLoader workers.

Each rank runs ``tests/torch/_ddp_rank.py`` in its own interpreter; the test waits with a
timeout, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fpipe.torch import worker_range

from .conftest import write_numbers
from .gloo import run_ranks

N = 43  # with batch size 2: 12 batches on rank 0 and 11 on rank 1 unless even= is set


def _run_ranks(path: str, folder: Path, world_size: int = 2) -> list[dict]:
    reports = [folder / f"rank{rank}.json" for rank in range(world_size)]
    return run_ranks("tests.torch._ddp_rank", [[str(rank), path, str(report)]
                                               for rank, report in enumerate(reports)],
                     reports, "the distributed run")


def _rank_positions(rank: int, epoch: int, even=None) -> list[int]:
    return sorted(i for worker in range(2) for i in worker_range(N, rank, 2, worker, 2, epoch, even))


@pytest.mark.slow
def test_two_gloo_ranks_with_two_workers_each(tmp_path):
    reports = _run_ranks(write_numbers(tmp_path / "numbers.msgpack", N), tmp_path)
    assert [(r["rank"], r["world_size"]) for r in reports] == [(0, 2), (1, 2)]
    for mode in ("set_epoch", "persistent"):
        for epoch in (0, 1):
            seen = [report[f"{mode}/{epoch}"] for report in reports]
            assert sorted(seen[0] + seen[1]) == list(range(N)), (mode, epoch)
            assert [sorted(s) for s in seen] == [_rank_positions(r, epoch) for r in range(2)]
    # equal batch counts: drop keeps 21 samples a rank, pad 22; the dataset knows the batch size
    # (2), so the workers' shards are whole batches but one: ceil(21 / 2) and 22 / 2 batches
    # (shards of 11 + 11 would make 6 + 6 with a short batch each)
    for even, batches in (("drop", 11), ("pad", 11)):
        for epoch in (0, 1):
            assert [report[f"{even}/{epoch}"] for report in reports] == [batches, batches]
        assert reports[0][f"{even}/weight"] == reports[1][f"{even}/weight"]
    # a mid-epoch resume on each rank gives that rank's batches from the fifth on
    for report in reports:
        assert report["resume/restarted"] == report["resume/whole"][5:]
    assert len({len(report["resume/restarted"]) for report in reports}) == 1
