"""Laws of fpipe.sharding: partition, balance, even lengths, and composition of strided shards;
the ranges of DataLoader workers, and the resume plan of a DataLoader's round-robin."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from fpipe.sharding import loader_batches, loader_length, resume_plan, shard, shard_range, worker_range
from property_tests.strategies import (
    batch_counts,
    evens,
    round_robin,
    roundings,
    shard_counts,
    sized_inputs,
    worker_epochs,
)


def _strided(xs, count, even=None):
    return [list(shard(i, count, even=even)(iter(xs))) for i in range(count)]


def _contiguous(n, count, even=None, rounding="balanced"):
    return [shard_range(n, i, count, even=even, rounding=rounding) for i in range(count)]


def _is_subsequence(part, whole):
    rest = iter(whole)
    return all(any(x == y for y in rest) for x in part)


@given(sized_inputs, shard_counts)
def test_strided_shards_partition_the_input_in_order(xs, count):
    shards = _strided(xs, count)
    assert sorted(x for s in shards for x in s) == xs
    assert all(_is_subsequence(s, xs) for s in shards)


@given(sized_inputs, shard_counts)
def test_strided_shard_sizes_differ_by_at_most_one(xs, count):
    sizes = [len(s) for s in _strided(xs, count)]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(0, 500), shard_counts, roundings)
def test_contiguous_shards_partition_range_n_into_adjacent_pieces(n, count, rounding):
    shards = _contiguous(n, count, rounding=rounding)
    assert [x for r in shards for x in r] == list(range(n))
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))


@given(st.integers(0, 500), shard_counts, roundings)
def test_contiguous_shard_sizes_differ_by_at_most_one(n, count, rounding):
    sizes = [len(r) for r in _contiguous(n, count, rounding=rounding)]
    assert max(sizes) - min(sizes) <= 1


@given(sized_inputs, shard_counts, evens)
def test_even_strided_shards_all_have_the_same_length(xs, count, even):
    shards = _strided(xs, count, even)
    target = len(xs) // count if even == "drop" else -(-len(xs) // count)
    assert [len(s) for s in shards] == [target] * count
    seen = Counter(x for s in shards for x in s)
    assert set(seen) <= set(xs)
    if even == "drop":
        assert max(seen.values(), default=1) == 1
    else:
        assert set(seen) == set(xs)


@given(st.integers(0, 500), shard_counts, evens, roundings)
def test_even_contiguous_shards_all_have_the_same_length(n, count, even, rounding):
    shards = _contiguous(n, count, even, rounding)
    target = n // count if even == "drop" else -(-n // count)
    assert [len(r) for r in shards] == [target] * count
    assert all(0 <= r.start and r.stop <= n for r in shards)
    covered = set().union(*shards)
    if even == "pad":
        assert covered == set(range(n))
    else:
        assert sum(map(len, shards)) == len(covered)


@given(sized_inputs, shard_counts, shard_counts, st.data())
def test_sharding_a_shard_multiplies_the_strides(xs, a, b, data):
    i = data.draw(st.integers(0, a - 1), label="i")
    j = data.draw(st.integers(0, b - 1), label="j")
    assert list(shard(j, b)(shard(i, a)(xs))) == list(shard(i + a * j, a * b)(xs))


# --- DataLoader workers: worker_range ---

sizes = st.integers(0, 300)
world_sizes = st.integers(1, 5)
worker_counts = st.integers(1, 5)
all_evens = st.sampled_from([None, "drop", "pad"])


def _layout(n, world_size, workers, epoch, even=None):
    return [[worker_range(n, rank, world_size, worker, workers, epoch, even) for worker in range(workers)]
            for rank in range(world_size)]


@given(sizes, world_sizes, worker_counts, worker_epochs)
def test_every_epoch_partitions_the_dataset_into_contiguous_shards(n, world_size, workers, epoch):
    layout = _layout(n, world_size, workers, epoch)
    assert sorted(i for rank in layout for shard in rank for i in shard) == list(range(n))
    lengths = [len(shard) for rank in layout for shard in rank]
    assert max(lengths) - min(lengths) <= 1


@given(sizes, world_sizes, worker_counts, worker_counts, worker_epochs)
def test_a_rank_reads_one_block_whatever_its_number_of_workers(n, world_size, workers, other, epoch):
    for rank in range(world_size):
        blocks = [[i for shard in _layout(n, world_size, k, epoch)[rank] for i in shard]
                  for k in (workers, other)]
        assert blocks[0] == blocks[1] == list(worker_range(n, rank, world_size, 0, 1, epoch))


@given(sizes, world_sizes, worker_counts, worker_epochs, all_evens)
def test_ranks_trade_blocks_with_the_epoch(n, world_size, workers, epoch, even):
    shifted = _layout(n, world_size, workers, 0, even)
    layout = _layout(n, world_size, workers, epoch, even)
    assert layout == [shifted[(rank + epoch) % world_size] for rank in range(world_size)]


@given(sizes, world_sizes, worker_counts, worker_epochs, evens)
def test_even_splits_every_rank_into_the_same_pieces(n, world_size, workers, epoch, even):
    layout = _layout(n, world_size, workers, epoch, even)
    assert len({tuple(map(len, rank)) for rank in layout}) == 1
    covered = [i for rank in layout for shard in rank for i in shard]
    if even == "drop":
        assert len(covered) == len(set(covered)) == n - n % world_size
    else:
        assert set(covered) == set(range(n)) and len(covered) == -(-n // world_size) * world_size


@given(sizes, world_sizes, worker_counts, worker_epochs, all_evens, st.integers(1, 9), st.booleans())
def test_batch_size_cuts_a_ranks_block_into_whole_batches_for_its_workers(
        n, world_size, workers, epoch, even, batch_size, drop_last):
    for rank in range(world_size):
        shards = [worker_range(n, rank, world_size, w, workers, epoch, even, batch_size)
                  for w in range(workers)]
        block = [i for shard in shards for i in shard]
        assert block == [i for i in worker_range(n, rank, world_size, 0, 1, epoch, even)]
        assert all(len(shard) % batch_size == 0 for shard in shards if shard.stop != shards[-1].stop)
        whole = len(block) // batch_size if drop_last else -(-len(block) // batch_size)
        assert loader_batches(map(len, shards), batch_size, drop_last) == whole
        assert loader_length(list(map(len, shards)), batch_size, drop_last) == len(block)


@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 9), st.booleans())
def test_the_length_told_to_a_loader_divides_into_its_workers_batches(lengths, batch_size, drop_last):
    told = loader_length(lengths, batch_size, drop_last)
    division = told // batch_size if drop_last else -(-told // batch_size)
    assert division == loader_batches(lengths, batch_size, drop_last)


# --- resuming a pass: the schedule of a DataLoader's round-robin over its workers ---

@given(batch_counts, st.integers(0, 80))
def test_the_resume_plan_is_what_a_round_robin_has_made(counts, done):
    made, first = resume_plan(counts, done)
    order = round_robin([[worker] * count for worker, count in enumerate(counts)])
    assert sum(made) == min(done, sum(counts))
    assert made == [order[:done].count(worker) for worker in range(len(counts))]
    assert first == (order[done] if done < len(order) else 0)


@given(batch_counts, st.integers(0, 80))
def test_workers_trading_shards_from_the_plan_hand_out_the_rest_in_order(counts, done):
    made, first = resume_plan(counts, done)
    workers = len(counts)
    batches = [[(worker, k) for k in range(count)] for worker, count in enumerate(counts)]
    rotated = [batches[(first + worker) % workers] for worker in range(workers)]
    resumed = round_robin([shard[made[batches.index(shard)]:] for shard in rotated])
    assert resumed == round_robin(batches)[done:]
