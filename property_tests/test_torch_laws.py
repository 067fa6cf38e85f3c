"""Laws of fpipe.torch's IterableDataset: the samples it yields across simulated ranks and
workers, and a resumed pass. (The arithmetic of its layout, worker_range and the resume plan,
has its laws in test_sharding_laws.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.dataset import ListReader
from fpipe.sharding import worker_range
from fpipe.torch import Elastic, IterableDataset, Samples, Shards
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
                layout = Shards(rank=rank, world_size=world_size, shuffle=shuffle,
                                buffer_samples=3)
                dataset = IterableDataset(reader, epoch=epoch, chunk_size=2, layout=layout,
                                          samples=Samples(seed=1))
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
    dataset = IterableDataset(reader, chunk_size=2,
                              layout=Shards(rank=1, world_size=2, shuffle=shuffle, buffer_samples=3),
                              samples=Samples(seed=1))
    original = _loader_batches(dataset, workers, batch_size, drop_last)
    dataset.set_epoch(0)
    dataset.resume(done, batch_size, drop_last)
    assert _loader_batches(dataset, workers, batch_size, drop_last) == original[done:]


# --- len(DataLoader): the batches the DataLoader yields, whatever the workers ---

_LAYOUTS = st.sampled_from([(Shards, {}), (Shards, {"shuffle": True, "buffer_samples": 3}),
                            (Shards, {"even": "drop"}), (Shards, {"even": "pad"}),
                            (Elastic, {}), (Elastic, {"even": "pad"})])


@st.composite
def _loaded_datasets(draw, max_workers: int = 3) -> tuple[IterableDataset, int, int, bool]:
    """A dataset of a random layout on a random rank, and the DataLoader's workers, batch size
    and drop_last; the dataset knows the batch size (always in elastic layouts) or not."""
    (kind, options), batch_size = draw(_LAYOUTS), draw(st.integers(1, 7))
    world_size = draw(st.integers(1, 3))
    known = kind is Elastic or draw(st.booleans())
    layout = kind(rank=draw(st.integers(0, world_size - 1)), world_size=world_size, **options)
    dataset = IterableDataset(ListReader([{"x": i} for i in range(draw(st.integers(0, 60)))]),
                              batch_size=batch_size if known else None, chunk_size=2,
                              epoch=draw(worker_epochs), layout=layout, samples=Samples(seed=1))
    return dataset, draw(st.integers(0, max_workers)), batch_size, draw(st.booleans())


@settings(max_examples=60)
@given(_loaded_datasets(max_workers=5))
def test_len_of_a_loader_is_the_number_of_batches_its_workers_make(case):
    dataset, workers, batch_size, drop_last = case
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                         drop_last=drop_last)
    assert len(loader) == len(_loader_batches(dataset, max(1, workers), batch_size, drop_last))


@settings(max_examples=6)
@given(_loaded_datasets())
def test_len_of_a_real_loader_is_the_number_of_batches_it_yields(case):
    dataset, workers, batch_size, drop_last = case
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                         drop_last=drop_last,
                                         multiprocessing_context="fork" if workers else None)
    assert len(loader) == sum(1 for _ in loader)
