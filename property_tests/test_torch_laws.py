"""Laws of fpipe.torch's IterableDataset: the samples it yields across simulated ranks and
workers, and a resumed pass. (The arithmetic of its layout, worker_range and the resume plan,
has its laws in test_sharding_laws.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.sharding import worker_range
from fpipe.storage import ListReader
from fpipe.torch import IterableDataset
from property_tests.strategies import round_robin, worker_epochs


@settings(max_examples=40)
@given(st.integers(0, 60), st.integers(1, 3), st.integers(1, 3), worker_epochs, st.booleans())
def test_ranks_and_workers_together_yield_every_sample_once(n, world_size, workers, epoch, shuffle):
    reader = ListReader([{"x": i} for i in range(n)])
    seen = []
    for rank in range(world_size):
        for worker in range(workers):
            info = SimpleNamespace(id=worker, num_workers=workers)
            with mock.patch.object(torch.utils.data, "get_worker_info", lambda info=info: info):
                dataset = IterableDataset(reader, rank=rank, world_size=world_size, epoch=epoch,
                                          shuffle=shuffle, seed=1, buf_size=3, chunk_size=2)
                shard = [sample["x"] for sample in dataset]
            assert sorted(shard) == list(worker_range(n, rank, world_size, worker, workers, epoch))
            seen += shard
    assert sorted(seen) == list(range(n))


def _loader_batches(dataset: IterableDataset, workers: int, batch_size: int, drop_last: bool) -> list:
    """The batches of x that a DataLoader with ``workers`` workers makes, simulated in-process."""
    queues = []
    for worker in range(workers):
        info = SimpleNamespace(id=worker, num_workers=workers)
        with mock.patch.object(torch.utils.data, "get_worker_info", lambda info=info: info):
            xs = [sample["x"] for sample in dataset]
        cut = [xs[i:i + batch_size] for i in range(0, len(xs), batch_size)]
        queues.append([b for b in cut if len(b) == batch_size or not drop_last])
    return round_robin(queues)


@settings(max_examples=40)
@given(st.integers(0, 40), st.integers(1, 4), st.integers(1, 5), st.booleans(), st.booleans(),
       st.integers(0, 30))
def test_a_resumed_pass_is_the_rest_of_the_simulated_loaders_epoch(
        n, workers, batch_size, drop_last, shuffle, done):
    reader = ListReader([{"x": i} for i in range(n)])
    dataset = IterableDataset(reader, rank=1, world_size=2, shuffle=shuffle, seed=1, buf_size=3,
                              chunk_size=2)
    original = _loader_batches(dataset, workers, batch_size, drop_last)
    dataset.set_epoch(0)
    dataset.resume(done, batch_size, drop_last)
    assert _loader_batches(dataset, workers, batch_size, drop_last) == original[done:]
