"""Laws of fpipe.torch's sharding: partitions, rotation, rank blocks, even batches, and the
samples an IterableDataset yields across simulated ranks and workers."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.storage import ListReader
from fpipe.torch import IterableDataset, _resume_plan, worker_range

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


# --- resuming a pass: the schedule of a DataLoader's round-robin over its workers ---

batch_counts = st.lists(st.integers(0, 12), min_size=1, max_size=6)


def _round_robin(queues: list[list]) -> list:
    """What a DataLoader hands out: one item from each worker in turn, passing over the
    workers that have run out."""
    queues, order = [list(queue) for queue in queues], []
    while any(queues):
        order += [queue.pop(0) for queue in queues if queue]
    return order


@given(batch_counts, st.integers(0, 80))
def test_the_resume_plan_is_what_a_round_robin_has_made(counts, done):
    made, first = _resume_plan(counts, done)
    order = _round_robin([[worker] * count for worker, count in enumerate(counts)])
    assert sum(made) == min(done, sum(counts))
    assert made == [order[:done].count(worker) for worker in range(len(counts))]
    assert first == (order[done] if done < len(order) else 0)


@given(batch_counts, st.integers(0, 80))
def test_workers_trading_shards_from_the_plan_hand_out_the_rest_in_order(counts, done):
    made, first = _resume_plan(counts, done)
    workers = len(counts)
    batches = [[(worker, k) for k in range(count)] for worker, count in enumerate(counts)]
    rotated = [batches[(first + worker) % workers] for worker in range(workers)]
    resumed = _round_robin([shard[made[batches.index(shard)]:] for shard in rotated])
    assert resumed == _round_robin(batches)[done:]


def _loader_batches(dataset: IterableDataset, workers: int, batch_size: int, drop_last: bool) -> list:
    """The batches of x that a DataLoader with ``workers`` workers makes, simulated in-process."""
    queues = []
    for worker in range(workers):
        info = SimpleNamespace(id=worker, num_workers=workers)
        with mock.patch.object(torch.utils.data, "get_worker_info", lambda info=info: info):
            xs = [sample["x"] for sample in dataset]
        cut = [xs[i:i + batch_size] for i in range(0, len(xs), batch_size)]
        queues.append([b for b in cut if len(b) == batch_size or not drop_last])
    return _round_robin(queues)


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
