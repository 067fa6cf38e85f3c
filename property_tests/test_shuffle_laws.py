"""Laws of the shuffle of a shard that follows the reader (``shuffled_shard``: blocks walked,
a true permutation, or a buffer), for every kind of reader and any window: each pass is a
permutation of the shard, the order depends on ``(seed, epoch)`` alone, starting at ``skip``
gives the tail of the pass without reading what only the skipped positions need, and epochs
differ."""

from hypothesis import given
from hypothesis import strategies as st

from fpipe.dataset.shuffling import shuffled_shard
from property_tests.strategies import (
    BlockIndexReader,
    IndexReader,
    SequentialIndexReader,
    seeds,
    shuffle_readers,
)

buffer_sizes = st.one_of(st.integers(1, 40), st.floats(0.01, 0.99))


@st.composite
def shards(draw: st.DrawFn) -> tuple:
    reader = draw(shuffle_readers())
    start = draw(st.integers(0, len(reader)))
    return reader, start, draw(st.integers(start, len(reader)))


def a_pass(reader, start, stop, seed, epoch, buf_size, skip=0):
    return list(shuffled_shard(reader, start, stop, seed=seed, epoch=epoch, skip=skip,
                               buf_size=buf_size, chunk_size=3))


@given(shards(), seeds, st.integers(0, 5), buffer_sizes)
def test_a_shuffled_pass_is_a_permutation_of_the_shard(shard, seed, epoch, buf_size):
    reader, start, stop = shard
    pairs = a_pass(reader, start, stop, seed, epoch, buf_size)
    assert sorted(index for index, _ in pairs) == list(range(start, stop))
    assert all(index == sample for index, sample in pairs)


@given(shards(), seeds, st.integers(0, 5), buffer_sizes)
def test_the_pass_depends_on_seed_and_epoch_alone(shard, seed, epoch, buf_size):
    reader, start, stop = shard
    before = a_pass(reader, start, stop, seed, epoch + 1, buf_size)  # reading first changes nothing
    assert a_pass(reader, start, stop, seed, epoch, buf_size) == a_pass(
        type(reader)(*_arguments(reader)), start, stop, seed, epoch, buf_size)
    assert a_pass(reader, start, stop, seed, epoch + 1, buf_size) == before


@given(shards(), seeds, st.integers(0, 5), buffer_sizes, st.data())
def test_starting_at_skip_gives_the_tail_of_the_pass(shard, seed, epoch, buf_size, data):
    reader, start, stop = shard
    whole = a_pass(reader, start, stop, seed, epoch, buf_size)
    skip = data.draw(st.integers(0, len(whole) + 2))
    reader.reads.clear()
    reader.gets = 0
    assert a_pass(reader, start, stop, seed, epoch, buf_size, skip) == whole[skip:]
    tail = {index for index, _ in whole[skip:]}
    if isinstance(reader, BlockIndexReader):
        # a block is read only if it holds a sample of the tail
        assert all(tail & set(range(low, high)) for low, high in reader.reads)
    elif type(reader) is IndexReader:
        assert reader.gets == len(tail) and not reader.reads


# datadings's quasi-shuffle (kept for readers without get) can repeat an order when the shard
# has few chunks: its law is in test_order_laws
@given(shards().filter(lambda shard: shard[2] - shard[1] >= 12
                       and not isinstance(shard[0], SequentialIndexReader)),
       seeds, st.integers(0, 5), buffer_sizes)
def test_epochs_differ(shard, seed, epoch, buf_size):
    reader, start, stop = shard
    assert a_pass(reader, start, stop, seed, epoch, buf_size) != a_pass(
        reader, start, stop, seed, epoch + 1, buf_size)


def _arguments(reader) -> tuple:
    return (reader.n, reader.blocks.tolist()) if isinstance(reader, BlockIndexReader) else (reader.n,)

