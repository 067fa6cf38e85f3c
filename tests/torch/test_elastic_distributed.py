"""Elastic resume across real processes: gloo ranks with DataLoader workers, stopped and
started again on other grids, as preempted jobs come back on other hardware.

Epoch 1 of 44 samples runs 3 steps on 2 ranks × 2 workers (batches of 2), then 4 steps on
1 rank × 3 workers (batches of 3), then to its end on 2 ranks × 1 worker (batches of 2). Each
grid is a new set of processes that loads the state the previous one saved to a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from ._elastic_rank import make
from .conftest import write_numbers
from .gloo import run_ranks

N = 44
GRIDS = [(2, 2, 2, 3), (1, 3, 3, 4), (2, 1, 2, -1)]  # ranks, workers, batch size, steps


def _run_grid(grid: tuple, path: str, state: str, folder: Path) -> list[dict]:
    world_size, workers, batch_size, steps = grid
    reports = [folder / f"{world_size}x{workers}-rank{rank}.json" for rank in range(world_size)]
    return run_ranks("tests.torch._elastic_rank",
                     [[str(rank), str(workers), str(batch_size), str(steps), path, state, str(report)]
                      for rank, report in enumerate(reports)], reports, f"the grid {grid}")


def _never_stopped(position: int, world_size: int, batch_size: int, params: dict) -> list[list]:
    """Rank by rank, the batches of a run on this grid that reads epoch 1 from ``position`` on."""
    step = world_size * batch_size
    return [[[[i, params[i]] for i in range(start + rank * batch_size, start + (rank + 1) * batch_size)]
             for start in range(position, N - step + 1, step)] for rank in range(world_size)]


@pytest.mark.slow
def test_a_run_carries_on_exactly_on_other_grids(tmp_path):
    path = write_numbers(tmp_path / "numbers.msgpack", N)
    whole = make(path, N)
    whole.set_epoch(1)
    params = {x: p for batch in DataLoader(whole, batch_size=N)
              for x, p in zip(batch["x"].tolist(), batch["__params__"]["p"].tolist())}
    seen, state, position = [], "-", 0
    for grid in GRIDS:
        reports = _run_grid(grid, path, state, tmp_path)
        world_size, _, batch_size, steps = grid
        assert [(r["rank"], r["world_size"]) for r in reports] == [(r, world_size) for r in range(world_size)]
        expected = _never_stopped(position, world_size, batch_size, params)
        assert [r["batches"] for r in reports] == [rank[:steps] if steps > 0 else rank for rank in expected]
        assert all(r["state"] == reports[0]["state"] for r in reports)
        seen += [x for r in reports for batch in r["batches"] for x, _ in batch]
        position = reports[0]["state"]["position"]
        state = str(tmp_path / f"state-{len(seen)}.json")
        Path(state).write_text(json.dumps(reports[0]["state"]))
    assert position == N and sorted(seen) == list(range(N))
