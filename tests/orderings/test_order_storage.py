"""The orderings over fpipe's real readers: MsgpackReader, ShardedReader and ListReader."""

import pickle
from itertools import islice

import msgpack
import pytest

from fpipe.dataset import FileWriter, ListReader, MsgpackReader, ShardedReader
from fpipe.orderings import Cycler, QuasiShuffler, Range, Repeater, Shuffler
from fpipe.sharding import shard_range


def _write(path, keys):
    with FileWriter(path) as writer:
        for key in keys:
            writer.write({"key": key, "value": int(key)})
    return MsgpackReader(path)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("order") / "x.msgpack", [f"{i:03d}" for i in range(37)])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    bounds = [(0, 10), (10, 11), (11, 30)]
    return ShardedReader([_write(folder / f"{a}.msgpack", [f"{i:03d}" for i in range(a, b)])
                          for a, b in bounds])


def values(ordering, **options):
    return [sample["value"] for sample in ordering.iter(**options)]


@pytest.mark.parametrize("make", [lambda r: Shuffler(r, seed=1),
                                  lambda r: QuasiShuffler(r, 0.3, 4, seed=1)],
                         ids=["Shuffler", "QuasiShuffler"])
def test_shufflers_permute_packed_and_sharded_datasets(make, reader, sharded):
    for source in (reader, sharded, ListReader([{"value": i} for i in range(23)])):
        shuffler = make(source)
        assert sorted(values(shuffler, start=0)) == list(range(len(source)))
        keys = [key for key, _ in shuffler.iter(0, yield_key=True)]
        assert [source.find_index(k) for k in keys] == values(shuffler, start=0)


def test_raw_samples_are_the_packed_bytes(reader):
    shuffler = QuasiShuffler(reader, 8, 4, seed=2)
    raw = list(shuffler.iter(0, raw=True))
    assert [msgpack.unpackb(b)["value"] for b in raw] == values(shuffler, start=0)
    views = list(shuffler.iter(0, raw=True, copy=False))
    assert [bytes(v) for v in views] == raw


def test_resume_over_a_packed_dataset_at_every_chunk_boundary(reader):
    whole = values(QuasiShuffler(reader, 8, 4, seed=3), start=0)
    for k in range(0, 37, 4):
        shuffler = QuasiShuffler(reader, 8, 4, seed=3)
        stream = iter(shuffler)
        head = [next(stream)["value"] for _ in range(k)]
        restored = QuasiShuffler(reader, 8, 4)
        restored.load_state_dict(shuffler.state_dict())
        assert head + [s["value"] for s in restored] == whole


def test_orderings_over_a_used_reader_pickle(reader):
    shuffler = Cycler(Shuffler(Range(reader, 5, 30), seed=4))
    head = [s["value"] for s in islice(iter(shuffler), 3)]
    clone = pickle.loads(pickle.dumps(shuffler))
    clone.load_state_dict({**shuffler.state_dict(), "position": 0})
    assert [s["value"] for s in islice(iter(clone), 3)] == head


def test_contiguous_shards_shuffled_within_cover_the_dataset_once_per_epoch(reader):
    # the torch adapter's recipe: a contiguous shard per worker, shuffled inside the shard
    for epoch in range(2):
        seen = []
        for index in range(3):
            window = shard_range(len(reader), index, 3, rounding="datadings")
            shuffler = QuasiShuffler(Range(reader, window.start, window.stop), 4, 2, seed=5)
            shuffler.set_epoch(epoch)
            seen += values(shuffler)
        assert sorted(seen) == list(range(37))


def test_repeater_over_a_packed_dataset(reader):
    assert values(Repeater(Range(reader, 0, 3), 2)) == [0, 1, 2, 0, 1, 2]
