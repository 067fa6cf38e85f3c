"""ShardedReader over many shards: lengths from a shard index or the shards' .offsets, shards
opened only when read; ShardedWriter and write_shard_index write the index; bad indexes raise
FormatError, stale counts of local shards are corrected with a warning, and shards at URLs that
disagree with them raise FormatError when opened."""

import json
import os
import pickle

import pytest

import fpipe.dataset.sharded as sharded_module
from fpipe.dataset import FileWriter, ListReader, ShardedReader, ShardedWriter, write_shard_index
from fpipe.errors import FormatError
from fpipe.orderings import IndexShuffler
from fpipe.remote import RemoteOptions

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


def _index_with(written, name, change):
    index = json.loads(open(f"{written}.shards").read())
    change(index)
    (written.parent / name).write_text(json.dumps(index))
    return written.parent / name


@pytest.mark.parametrize("stale", [0, 2, 4, 1000])
def test_a_stale_count_of_a_local_shard_is_corrected_with_a_warning_naming_both(written, stale):
    """Regression: a count of 0 made the shard's samples vanish (and another count numbered
    the samples after it wrongly until the shard was opened)."""
    path = _index_with(written, f"stale{stale}.shards",
                       lambda index: index["samples"].__setitem__(3, stale))
    with pytest.warns(UserWarning, match=rf"stale{stale}\.shards: .*shard 3 \(\S*train-00003"
                                         rf"\.msgpack\) holds 3, not {stale}; .*own counts"):
        reader = ShardedReader(path)
    assert len(reader) == SHARDS * PER - 1
    assert [s["x"] for s in reader.iter(6, 15)] == list(range(6, 15))
    assert reader.get(12)["x"] == 12 and reader.find_index("00010") == 10


@pytest.mark.parametrize("count", [2**63, 2**64, 2**32, -1, 1.5, True, "3", None])
def test_a_count_no_shard_can_hold_raises_format_error_naming_the_index_and_the_shard(
        written, count):
    """Regression: OverflowError, and ValueError: __len__() should return >= 0."""
    path = _index_with(written, "huge.shards", lambda index: index["samples"].__setitem__(3, count))
    with pytest.raises(FormatError, match=r"huge\.shards: corrupt shard index \(shard 3 "
                                          r"\(train-00003\.msgpack\) is listed with"):
        len(ShardedReader(path))


def test_a_shard_listed_twice_raises_format_error(written):
    path = _index_with(written, "twice.shards", lambda index: index["shards"].__setitem__(
        2, "train-00000.msgpack"))
    with pytest.raises(FormatError, match=r"twice\.shards: .*shard 2 \(train-00000\.msgpack\) "
                                          "is listed before, as shard 0"):
        ShardedReader(path)


def test_a_shard_at_a_url_is_checked_when_opened_and_one_listed_empty_at_once(tmp_path):
    with ShardedWriter(tmp_path / "t", shard_size=3) as writer:
        for i in range(7):
            writer.write({"key": f"{i}"})
    index = json.loads((tmp_path / "t.shards").read_text())
    index["samples"] = [0, 2, 1]
    (tmp_path / "u.shards").write_text(json.dumps(index))
    with pytest.warns(UserWarning, match=r"u\.shards: .*shard 0 \(file://\S*t-00000\.msgpack\) "
                                         "holds 3, not 0"):
        reader = ShardedReader(f"file://{tmp_path}/u.shards",
                               remote=RemoteOptions(cache_dir=tmp_path / "cache"))
    assert len(reader) == 6 and [reader.get(i)["key"] for i in range(3)] == ["0", "1", "2"]
    with pytest.raises(FormatError, match=r"u\.shards: shard 1 \(file://\S*t-00001\.msgpack\) "
                                          "has 3 samples; the shard index lists 2"):
        reader.get(3)


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
