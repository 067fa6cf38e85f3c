"""ShardedReader over many shards: lengths from a shard index or the shards' .offsets, shards
opened only when read; ShardedWriter and write_shard_index write the index; bad indexes and
shards that disagree with them raise FormatError."""

import json
import os
import pickle

import pytest

import fpipe.storage.sharded as sharded_module
from fpipe.errors import FormatError
from fpipe.storage import (
    FileWriter,
    IndexShuffler,
    ListReader,
    ShardedReader,
    ShardedWriter,
    write_shard_index,
)

SHARDS, PER = 300, 3


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("shards") / "train"
    with ShardedWriter(prefix, shard_size=PER) as writer:
        for i in range(SHARDS * PER - 1):  # the last shard is short
            writer.write({"key": f"{i:05d}", "x": i})
    return prefix


@pytest.fixture
def opened(monkeypatch):
    """The paths of the shards that MsgpackReader opens from now on."""
    paths = []
    real = sharded_module.MsgpackReader

    def counting(path, **options):
        paths.append(os.path.basename(path))
        return real(path, **options)
    monkeypatch.setattr(sharded_module, "MsgpackReader", counting)
    return paths


def test_a_shard_index_opens_no_shard_until_one_is_read(written, opened):
    reader = ShardedReader(f"{written}.shards")
    assert len(reader) == SHARDS * PER - 1 and opened == []
    assert reader.get(600) == {"key": "00600", "x": 600} and opened == ["train-00200.msgpack"]
    assert [s["x"] for s in reader.iter(598, 604)] == list(range(598, 604))
    assert opened == ["train-00200.msgpack", "train-00199.msgpack", "train-00201.msgpack"]
    assert reader.get(-1)["x"] == SHARDS * PER - 2


def test_a_pattern_of_local_shards_opens_lazily_too(written, opened):
    reader = ShardedReader(f"{written}-*.msgpack")
    assert len(reader) == SHARDS * PER - 1 and opened == []
    assert reader.get(4)["x"] == 4 and opened == ["train-00001.msgpack"]


def test_it_shuffles_and_pickles_without_its_open_shards(written):
    reader = ShardedReader(f"{written}.shards")
    reader.get(0)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._opened == {} and copy.get(5)["x"] == 5
    order = [s["x"] for s in IndexShuffler(copy, seed=1)]
    assert sorted(order) == list(range(SHARDS * PER - 1))
    assert reader.find_index("00007") == 7 and "00899" not in reader


def test_a_shard_that_disagrees_with_the_index_raises_when_opened(written, tmp_path):
    index = json.loads(open(f"{written}.shards").read())
    index["samples"][3] += 1
    folder = written.parent
    (folder / "wrong.shards").write_text(json.dumps(index))
    reader = ShardedReader(folder / "wrong.shards")
    assert reader.get(0)["x"] == 0
    with pytest.raises(FormatError, match="shard 3 has 3 samples; the shard index"):
        reader.get(10)


@pytest.mark.parametrize("content", [
    "not json", json.dumps({"format": "other", "version": 1, "shards": [], "samples": []}),
    json.dumps({"format": "fpipe-shards", "version": 1, "shards": ["a"], "samples": []}),
    json.dumps({"format": "fpipe-shards", "version": 1, "shards": ["../a.msgpack"],
                "samples": [1]}),
    json.dumps({"format": "fpipe-shards", "version": 1, "shards": ["/etc/a.msgpack"],
                "samples": [1]}),
    json.dumps({"format": "fpipe-shards", "version": 1, "shards": ["a.msgpack"],
                "samples": [-1]}),
], ids=["json", "format", "lengths", "parent", "absolute", "negative"])
def test_a_bad_shard_index_raises_format_error_naming_it(tmp_path, content):
    (tmp_path / "x.shards").write_text(content)
    with pytest.raises(FormatError, match="x.shards: corrupt shard index"):
        ShardedReader(tmp_path / "x.shards")


def test_write_shard_index_indexes_shards_written_otherwise(tmp_path):
    paths = []
    for part, count in enumerate([2, 0, 3]):
        paths.append(tmp_path / "parts" / f"p{part}.msgpack")
        with FileWriter(paths[-1]) as writer:
            for i in range(count):
                writer.write({"key": f"{part}-{i}"})
    write_shard_index(paths, tmp_path / "all.shards")
    reader = ShardedReader(tmp_path / "all.shards")
    assert [s["key"] for s in reader] == ["0-0", "0-1", "2-0", "2-1", "2-2"]
    with pytest.raises(ValueError, match="not in the folder"):
        write_shard_index(paths, tmp_path / "parts" / "elsewhere" / "x.shards")
    with pytest.raises(ValueError, match="X.shards"):
        write_shard_index(paths, tmp_path / "all.json")


def test_sharded_writer_refuses_to_replace_an_index_and_urls(written, tmp_path):
    with pytest.raises(FileExistsError, match="shard index exists"):
        ShardedWriter(written, shard_size=2)
    with pytest.raises(ValueError, match="local shards"):
        ShardedWriter("s3://bucket/train", shard_size=2)
    with pytest.raises(ValueError, match="shard_size"):
        ShardedWriter(tmp_path / "t", shard_size=0)
    writer = ShardedWriter(tmp_path / "t", shard_size=2)
    writer.close()
    assert len(ShardedReader(tmp_path / "t.shards")) == 0
    with pytest.raises(ValueError, match="closed"):
        writer.write({"key": "a"})


def test_readers_given_as_objects_keep_working(tmp_path):
    reader = ShardedReader([ListReader([{"key": "a"}]), ListReader([])])
    assert len(reader) == 1 and reader.readers[1].__class__ is ListReader
    with pytest.raises(TypeError, match="shards must be paths or readers"):
        ShardedReader([3])
