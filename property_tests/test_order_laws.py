"""Laws of the orderings: permutation, determinism, epochs differ, resume (twice), the
QuasiShuffler's memory bound and contiguous reads, and the IndexShuffler's keyed bijection at
any length."""

import json
from itertools import islice

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.orderings.order import QuasiShuffler, Range, Shuffler
from fpipe.orderings.permutation import TABLE_MAX, IndexShuffler, Permutation
from property_tests.strategies import (
    IndexReader,
    build,
    ordering_lengths,
    ordering_specs,
    seeds,
)

buffer_sizes = st.one_of(st.integers(1, 80), st.floats(0.01, 0.99))
chunk_sizes = st.integers(1, 20)


def take(ordering, count):
    """``count`` items from passes over ``ordering``, one fresh iteration per pass."""
    taken = []
    while len(taken) < count:
        before = len(taken)
        taken.extend(islice(iter(ordering), count - len(taken)))
        if len(taken) == before:
            break
    return taken


def _shufflers(n, seed, buf_size, chunk_size):
    return [Shuffler(IndexReader(n), seed=seed),
            QuasiShuffler(IndexReader(n), buf_size=buf_size, chunk_size=chunk_size, seed=seed),
            IndexShuffler(IndexReader(n), seed=seed)]


@given(ordering_lengths, seeds, buffer_sizes, chunk_sizes)
def test_every_pass_of_a_shuffler_is_a_permutation(n, seed, buf_size, chunk_size):
    for shuffler in _shufflers(n, seed, buf_size, chunk_size):
        for _ in range(2):
            assert sorted(shuffler) == list(range(n))


@given(ordering_lengths, st.integers(0, 30), st.integers(0, 70), seeds, buffer_sizes,
       chunk_sizes)
def test_a_shuffler_over_a_range_permutes_that_range(n, start, stop, seed, buf_size, chunk):
    window = range(n)[start:stop]
    for shuffler in (Shuffler(Range(IndexReader(n), start, stop), seed=seed),
                     QuasiShuffler(Range(IndexReader(n), start, stop), buf_size, chunk, seed),
                     IndexShuffler(Range(IndexReader(n), start, stop), seed=seed)):
        assert sorted(shuffler) == list(window)


@given(ordering_lengths, seeds, buffer_sizes, chunk_sizes, st.integers(0, 5))
def test_the_order_depends_on_seed_and_epoch_alone(n, seed, buf_size, chunk_size, epoch):
    first = _shufflers(n, seed, buf_size, chunk_size)
    second = _shufflers(n, seed, buf_size, chunk_size)
    for a, b in zip(first, second):
        passes = [list(a) for _ in range(epoch + 1)]
        b.set_epoch(epoch)
        assert list(b) == passes[-1]
        assert list(a.iter(0)) == list(b.iter(0))


@given(st.integers(12, 200), seeds, buffer_sizes, chunk_sizes)
def test_epochs_differ(n, seed, buf_size, chunk_size):
    shuffler, quasi, indexed = _shufflers(n, seed, buf_size, chunk_size)
    assert list(shuffler) != list(shuffler)
    assert list(indexed) != list(indexed)
    # datadings's quasi-shuffle (which fpipe keeps) leaves samples in slot order at the end
    # and in file order within a chunk: with few chunks, two epochs can coincide
    if quasi.buffer_size >= n or n >= 6 * chunk_size:
        assert list(quasi) != list(quasi)


@settings(max_examples=100)
@given(ordering_specs, ordering_lengths, seeds, st.integers(0, 150), st.integers(0, 150),
       st.integers(0, 150))
def test_resume_continues_exactly_even_after_a_second_save(spec, n, seed, first, second, third):
    expected = take(build(spec, IndexReader(n), seed), first + second + third)
    ordering = build(spec, IndexReader(n), seed)
    taken = take(ordering, first)
    for count in (second, third):
        state = json.loads(json.dumps(ordering.state_dict()))
        ordering = build(spec, IndexReader(n))  # fresh entropy: the state brings the seeds
        ordering.load_state_dict(state)
        taken += take(ordering, count)
    assert taken == expected


@given(ordering_specs, ordering_lengths, seeds, st.integers(0, 200))
def test_seek_moves_to_that_position_counted_from_the_epoch_start(spec, n, seed, position):
    reference = take(build(spec, IndexReader(n), seed), position + 5)
    ordering = build(spec, IndexReader(n), seed)
    ordering.seek(position)
    assert take(ordering, 5) == reference[position:]


@settings(max_examples=60)
@given(st.integers(0, 300), seeds, buffer_sizes, chunk_sizes, st.data())
def test_quasi_shuffler_holds_at_most_buffer_and_one_chunk(n, seed, buf_size, chunk, data):
    reader = IndexReader(n, tracked=True)
    shuffler = QuasiShuffler(reader, buf_size=buf_size, chunk_size=chunk, seed=seed)
    start = data.draw(st.integers(0, n), label="start")
    seen = [sample.index for sample in shuffler.iter(start)]
    assert len(seen) == n - start
    # the buffer, the chunk being read, and the one sample the consumer still holds
    assert reader.live[1] <= shuffler.buffer_size + chunk + 1
    assert shuffler.buffer_size % chunk == 0


@given(st.integers(0, 300), seeds, buffer_sizes, chunk_sizes)
def test_quasi_shuffler_reads_each_chunk_contiguously_once(n, seed, buf_size, chunk):
    reader = IndexReader(n)
    list(QuasiShuffler(reader, buf_size=buf_size, chunk_size=chunk, seed=seed))
    assert reader.gets == 0
    # one read per chunk, except the chunk the buffer's fill ends in, which takes two
    assert len(reader.reads) <= -(-n // chunk) + 1
    assert all(start // chunk == (stop - 1) // chunk for start, stop in reader.reads)
    assert [i for start, stop in sorted(reader.reads) for i in range(start, stop)] == list(
        range(n))


# --- the IndexShuffler past its table: a Feistel network, checked at lengths up to 2**40 -----

feistel_lengths = st.integers(TABLE_MAX + 1, 2**40)


@settings(max_examples=25)
@given(st.integers(TABLE_MAX + 1, TABLE_MAX + 3000), seeds, st.integers(0, 3))
def test_the_network_permutes_every_length_past_the_table(n, seed, epoch):
    order = Permutation(n, seed, epoch).take(np.arange(n))
    assert (np.sort(order) == np.arange(n)).all()


@given(feistel_lengths, seeds, st.integers(0, 2**20), st.data())
def test_positions_undo_take_and_index_agrees_with_take(n, seed, epoch, data):
    permutation = Permutation(n, seed, epoch)
    positions = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50)))
    indices = permutation.take(positions)
    assert ((0 <= indices) & (indices < n)).all()
    assert (permutation.positions(indices) == positions).all()
    assert [permutation.index(int(p)) for p in positions] == indices.tolist()
    # distinct positions go to distinct indices
    assert len(set(indices.tolist())) == len(set(positions.tolist()))


@settings(max_examples=50)
@given(feistel_lengths, seeds, st.integers(0, 5), st.integers(0, 2**40), st.integers(0, 40),
       st.integers(1, 40))
def test_an_index_shuffler_of_any_length_resumes_from_its_position(n, seed, epoch, at, first,
                                                                   then):
    at %= n - first - then  # within the epoch
    shuffler = IndexShuffler(IndexReader(n), seed=seed)
    shuffler.set_epoch(epoch)
    expected = [shuffler.get(p) for p in range(at, at + first + then)]
    shuffler.seek(at)
    taken = list(islice(iter(shuffler), first))
    restored = IndexShuffler(IndexReader(n))
    restored.load_state_dict(json.loads(json.dumps(shuffler.state_dict())))
    assert taken + list(islice(iter(restored), then)) == expected
