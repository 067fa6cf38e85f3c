"""Laws of the elastic layout (fpipe.sharding.elastic_batches): a run that stops after any
number of steps and carries on on any other grid of ranks × workers, with any batch size,
sees the epoch: each sample once (even=None), never twice (even="drop"), every one (even="pad");
and the ranks always make the same number of batches when even= is set."""

from hypothesis import given
from hypothesis import strategies as st

from fpipe.sharding import elastic_batches, elastic_position
from property_tests.strategies import round_robin

sizes = st.integers(0, 200)
all_evens = st.sampled_from([None, "drop", "pad"])
grids = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 7))  # ranks, workers, batch
segments = st.lists(st.tuples(grids, st.integers(0, 30)), min_size=1, max_size=3)


def _rank_batches(n, position, grid, rank, even):
    """What rank ``rank``'s DataLoader hands out: its workers' batches, one from each in turn."""
    world_size, workers, batch_size = grid
    return round_robin([list(elastic_batches(n, position, batch_size, rank, world_size, worker,
                                             workers, even)) for worker in range(workers)])


def _run(n, position, grid, steps, even):
    """The samples of ``steps`` steps on ``grid`` from ``position``, and the position after."""
    batches = [_rank_batches(n, position, grid, rank, even)[:steps] for rank in range(grid[0])]
    samples = [p % n for rank in batches for batch in rank for p in batch]
    taken = max(map(len, batches))
    return samples, elastic_position(n, position, taken, grid[2], grid[0])


def _whole(n, segments, even):
    """A run through ``segments`` (grid, steps), the last one to the end of the epoch."""
    seen, position = [], 0
    for at, (grid, steps) in enumerate(segments):
        samples, position = _run(n, position, grid, steps if at + 1 < len(segments) else 10**6, even)
        seen += samples
    return seen, max(grid[0] for grid, _ in segments)


@given(sizes, segments)
def test_after_any_grid_changes_the_epoch_is_seen_exactly_once(n, segments):
    seen, _ = _whole(n, segments, None)
    assert sorted(seen) == list(range(n))


@given(sizes, segments)
def test_with_drop_nothing_repeats_and_fewer_than_a_round_of_ranks_is_left_out(n, segments):
    seen, widest = _whole(n, segments, "drop")
    assert len(seen) == len(set(seen)) and n - len(seen) < widest
    assert set(range(n)) - set(seen) <= set(range(n - widest, n))  # only the end of the order


@given(sizes.filter(bool), segments)
def test_with_pad_everything_is_seen_and_only_the_pad_repeats(n, segments):
    seen, widest = _whole(n, segments, "pad")
    assert set(seen) == set(range(n)) and len(seen) - n < widest


@given(sizes, st.integers(0, 200), grids, st.sampled_from(["drop", "pad"]))
def test_even_ranks_make_the_same_number_of_batches_of_the_same_sizes(n, position, grid, even):
    position = min(position, n)
    ranks = [_rank_batches(n, position, grid, rank, even) for rank in range(grid[0])]
    assert len({tuple(map(len, batches)) for batches in ranks}) == 1


@given(sizes, st.integers(0, 200), grids, all_evens)
def test_workers_hand_out_the_ranks_batches_in_the_order_of_the_global_steps(n, position, grid, even):
    position = min(position, n)
    world_size, _, batch_size = grid
    for rank in range(world_size):
        alone = list(elastic_batches(n, position, batch_size, rank, world_size, even=even))
        assert _rank_batches(n, position, grid, rank, even) == alone
        step = batch_size * world_size
        full = [range(position + t * step + rank * batch_size, position + t * step + (rank + 1) * batch_size)
                for t in range((n - position) // step)]
        assert alone[:len(full)] == full and len(alone) - len(full) <= 1
        last = position + len(full) * step  # the short last step stays within its global batch
        assert all(last <= batch.start <= batch.stop <= last + step for batch in alone[len(full):])
