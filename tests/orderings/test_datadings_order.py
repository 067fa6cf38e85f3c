"""Same seed, same order: fpipe's Shuffler and QuasiShuffler against the real datadings 3.4.7,
item for item and epoch after epoch, over the same dataset file."""

import datadings.reader as dd
import pytest

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.orderings import QuasiShuffler, Shuffler


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("same-order") / "x.msgpack"
    with FileWriter(path) as writer:
        for i in range(203):
            writer.write({"key": f"{i:03d}"})
    return path


def _keys(ordering):
    return [sample["key"] for sample in ordering]


@pytest.mark.parametrize("seed", [0, 42, 2 ** 40 + 7])
def test_shuffler_gives_datadings_order_every_epoch(path, seed):
    theirs, ours = dd.Shuffler(dd.MsgpackReader(path), seed=seed), Shuffler(MsgpackReader(path), seed=seed)
    for _ in range(3):
        assert _keys(ours) == _keys(theirs)


@pytest.mark.parametrize(("buf_size", "chunk_size"),
                         [(0.01, 16), (0.01, 1), (1, 1), (10, 3), (32, 16), (50, 7), (202, 1)])
@pytest.mark.parametrize("seed", [0, 42])
def test_quasi_shuffler_gives_datadings_order_every_epoch(path, buf_size, chunk_size, seed):
    theirs = dd.QuasiShuffler(dd.MsgpackReader(path), buf_size, chunk_size, seed)
    ours = QuasiShuffler(MsgpackReader(path), buf_size, chunk_size, seed)
    for _ in range(3):
        assert _keys(ours) == _keys(theirs)


def test_quasi_shuffler_resumes_inside_datadings_order(path):
    full = _keys(dd.QuasiShuffler(dd.MsgpackReader(path), 20, 4, seed=5))
    for position in (0, 3, 16, 20, 100, 183, 184, 200, 202):
        ours = QuasiShuffler(MsgpackReader(path), 20, 4, seed=5)
        ours.seek(position)
        assert _keys(ours) == full[position:]


def test_a_shuffler_seeded_with_the_length_gives_datadings_unseeded_order(path):
    # datadings' seed=None meant len(reader); fpipe's means fresh entropy
    assert _keys(Shuffler(MsgpackReader(path), seed=203)) == _keys(dd.Shuffler(dd.MsgpackReader(path)))


def test_where_the_streams_differ(path):
    # datadings used 1 % for any fraction: 0.5 gives it a buffer of 3 chunks of 1
    assert (_keys(QuasiShuffler(MsgpackReader(path), 0.5, 1, seed=0))
            != _keys(dd.QuasiShuffler(dd.MsgpackReader(path), 0.5, 1, seed=0)))
    # an epoch that fits in the buffer: datadings gave the chunks in file order
    theirs = _keys(dd.QuasiShuffler(dd.MsgpackReader(path), 256, 16, seed=0))
    ours = _keys(QuasiShuffler(MsgpackReader(path), 256, 16, seed=0))
    assert theirs[:16] == sorted(theirs[:16]) and ours[:16] != sorted(ours[:16])
    assert sorted(ours) == sorted(theirs)
