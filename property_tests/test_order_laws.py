"""Laws of the orderings: permutation, determinism, epochs differ, resume (twice), and the
QuasiShuffler's memory bound and contiguous reads."""

import json
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from fpipe.storage.order import QuasiShuffler, Range, Shuffler
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
            QuasiShuffler(IndexReader(n), buf_size=buf_size, chunk_size=chunk_size, seed=seed)]


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
                     QuasiShuffler(Range(IndexReader(n), start, stop), buf_size, chunk, seed)):
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
    shuffler, quasi = _shufflers(n, seed, buf_size, chunk_size)
    assert list(shuffler) != list(shuffler)
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
