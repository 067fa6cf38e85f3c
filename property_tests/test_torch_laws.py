"""Laws of fpipe.torch's sharding: partitions, rotation, rank blocks, even batches, and the
samples an IterableDataset yields across simulated ranks and workers."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.storage import ListReader
from fpipe.torch import IterableDataset, worker_range

sizes = st.integers(0, 300)
world_sizes = st.integers(1, 5)
worker_counts = st.integers(1, 5)
epochs = st.integers(0, 7)
evens = st.sampled_from([None, "drop", "pad"])


def _layout(n, world_size, workers, epoch, even=None):
    return [[worker_range(n, rank, world_size, worker, workers, epoch, even) for worker in range(workers)]
            for rank in range(world_size)]


@given(sizes, world_sizes, worker_counts, epochs)
def test_every_epoch_partitions_the_dataset_into_contiguous_shards(n, world_size, workers, epoch):
    layout = _layout(n, world_size, workers, epoch)
    assert sorted(i for rank in layout for shard in rank for i in shard) == list(range(n))
    lengths = [len(shard) for rank in layout for shard in rank]
    assert max(lengths) - min(lengths) <= 1


@given(sizes, world_sizes, worker_counts, worker_counts, epochs)
def test_a_rank_reads_one_block_whatever_its_number_of_workers(n, world_size, workers, other, epoch):
    for rank in range(world_size):
        blocks = [[i for shard in _layout(n, world_size, k, epoch)[rank] for i in shard]
                  for k in (workers, other)]
        assert blocks[0] == blocks[1] == list(worker_range(n, rank, world_size, 0, 1, epoch))


@given(sizes, world_sizes, worker_counts, epochs, evens)
def test_ranks_trade_blocks_with_the_epoch(n, world_size, workers, epoch, even):
    shifted = _layout(n, world_size, workers, 0, even)
    layout = _layout(n, world_size, workers, epoch, even)
    assert layout == [shifted[(rank + epoch) % world_size] for rank in range(world_size)]


@given(sizes, world_sizes, worker_counts, epochs, st.sampled_from(["drop", "pad"]))
def test_even_splits_every_rank_into_the_same_pieces(n, world_size, workers, epoch, even):
    layout = _layout(n, world_size, workers, epoch, even)
    assert len({tuple(map(len, rank)) for rank in layout}) == 1
    covered = [i for rank in layout for shard in rank for i in shard]
    if even == "drop":
        assert len(covered) == len(set(covered)) == n - n % world_size
    else:
        assert set(covered) == set(range(n)) and len(covered) == -(-n // world_size) * world_size


@settings(max_examples=40)
@given(st.integers(0, 60), st.integers(1, 3), st.integers(1, 3), epochs, st.booleans())
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
