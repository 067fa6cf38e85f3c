"""ListReader, DirectoryReader, ZipFileReader and ShardedReader, against datadings where it works."""

import copy
import os
import pickle
import zipfile

import pytest
from datadings.reader import DirectoryReader as DatadingsDirectoryReader
from datadings.reader import ListReader as DatadingsListReader
from datadings.reader import ZipFileReader as DatadingsZipFileReader
from datadings.reader.sharded import ShardedReader as DatadingsShardedReader

from fpipe.dataset import (
    DirectoryReader,
    ListReader,
    MsgpackReader,
    ShardedReader,
    ZipFileReader,
    pack_sample,
)

from .conftest import make_samples, write


def _label_samples():
    return [{"key": f"k{i}", "label": label, "x": i}
            for i, label in enumerate(["b10", "a", "b9", "a", None if False else "b10"])]


def test_list_reader_matches_datadings():
    ours, theirs = ListReader(_label_samples()), DatadingsListReader(_label_samples())
    assert ours.labels == theirs.labels == ["a", "b9", "b10"]
    assert [ours.get(i) for i in range(5)] == [theirs.get(i) for i in range(5)]
    assert ours.get(2, yield_key=True, raw=True) == theirs.get(2, yield_key=True, raw=True)
    assert ours.find_index("k3") == 3 and ours.find_key(-1) == "k4" and "k1" in ours and [] not in ours


def test_list_reader_keys_labels_and_functions():
    samples = [{"label": 2}, {"label": 10}, {"key": "named", "label": 1}]
    reader = ListReader(samples, initfun=lambda s: s.update(seen=True),
                        convertfun=lambda s: s.update(x=s["key"]))
    assert reader.labels == [1, 2, 10] and samples[0] == {"label": 2, "key": 0, "seen": True}
    assert reader[1] == {"label": 2, "_label": 10, "key": 1, "seen": True, "x": 1}
    assert "x" not in samples[1]
    assert ListReader([{"label": "z"}], labels=["z", "y"])[0]["label"] == 0
    assert ListReader([{"label": 5}], numeric_labels=False)[0] == {"label": 5, "key": 0}
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        ListReader([{"key": "a"}, {"key": "a"}])
    with pytest.raises(ValueError, match="labels="):
        ListReader([{"label": None}])
    assert ListReader([{"label": None}, {"label": "a"}], labels=[None, "a"])[0]["label"] == 0


def test_list_reader_labels_from_a_file(tmp_path):
    (tmp_path / "labels.txt").write_text("dog\ncat\n")
    reader = ListReader([{"label": "cat"}], labels=tmp_path / "labels.txt")
    assert reader.labels == ["dog", "cat"] and reader[0]["label"] == 1


def test_list_reader_has_the_whole_reader_api():
    reader = ListReader([{"key": str(i)} for i in range(10)])
    assert reader[2:5] == [{"key": "2"}, {"key": "3"}, {"key": "4"}] and reader[::-4] == [
        {"key": "9"}, {"key": "5"}, {"key": "1"}]
    assert [s["key"] for s in reader.iter(-3, chunk_size=2)] == ["7", "8", "9"]
    assert reader.get_many([9, 0]) == [{"key": "9"}, {"key": "0"}]
    assert list(reader.slice(8)) == [{"key": "8"}, {"key": "9"}]
    with reader:
        assert len(reader) == 10


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    for label, names in {"cat": ["1.jpg", "2.png"], "dog": ["3.jpg"], "cow": ["sub/4.jpg"]}.items():
        for name in names:
            (root / label / name).parent.mkdir(parents=True, exist_ok=True)
            (root / label / name).write_bytes(f"{label}:{name}".encode())
    return root


def _summary(reader):
    return sorted((s["key"], s["label"], s["_label"], s["data"]) for s in reader)


def test_directory_reader_matches_datadings_on_a_label_glob(tree):
    pattern = os.path.join(tree, "{LABEL}", "**")
    ours, theirs = DirectoryReader(pattern), DatadingsDirectoryReader(pattern)
    assert _summary(ours) == _summary(theirs)
    assert [s["key"] for s in ours] == ["cat/1.jpg", "cat/2.png", "cow/sub/4.jpg", "dog/3.jpg"]
    assert ours.bytes_read > 0
    options = dict(include=["*.jpg"], exclude=["*sub*"])
    filtered = DirectoryReader(pattern, **options)
    assert _summary(filtered) == _summary(DatadingsDirectoryReader(pattern, **options))


def test_directory_reader_reads_list_files(tree, tmp_path):
    listing = tmp_path / "list.tsv"
    listing.write_text("cat/1.jpg\tfeline\textra\ndog/3.jpg\tcanine\n")
    reader = DirectoryReader(listing, root_dir=tree)
    theirs = DatadingsDirectoryReader([str(listing)], root_dir=str(tree))
    assert [reader[i] for i in range(2)] == [theirs.get(i) for i in range(2)]
    assert reader[0]["_additional_info"] == ["extra"] and reader[1]["data"] == b"dog:3.jpg"
    with open(listing, "a") as file:
        file.write("\n")  # datadings reads a blank line as a sample with an empty path
    assert len(DirectoryReader(listing, root_dir=tree)) == 2


def test_directory_reader_with_several_patterns_strips_their_common_prefix(tree):
    patterns = [os.path.join(tree, "cat", "*"), os.path.join(tree, "dog", "*")]
    reader = DirectoryReader(patterns, numeric_labels=False)
    assert [s["key"] for s in reader] == ["cat/1.jpg", "cat/2.png", "dog/3.jpg"]
    assert reader[0]["label"] is None


def test_directory_reader_pickles_and_convertfun_runs_after_loading(tree):
    pattern = os.path.join(tree, "{LABEL}", "**")
    reader = DirectoryReader(pattern, convertfun=_upper)
    assert reader[0]["data"] == b"CAT:1.JPG"
    assert pickle.loads(pickle.dumps(reader))[0]["data"] == b"CAT:1.JPG"


def _upper(sample):
    sample["data"] = sample["data"].upper()


@pytest.fixture
def archive(tmp_path, tree):
    path = tmp_path / "tree.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        for file in sorted(tree.rglob("*")):
            if file.is_file():
                zipped.write(file, file.relative_to(tree).as_posix())
        zipped.writestr("readme.txt", b"not in a label folder")
    return path


def test_zip_reader_matches_datadings(archive):
    ours, theirs = ZipFileReader(archive), DatadingsZipFileReader(archive)
    assert _summary(ours) == _summary(theirs)
    assert ours[0]["key"] == "cat/1.jpg" and ours[0]["data"] == b"cat:1.jpg"
    other = ZipFileReader(archive, patterns="*.txt", numeric_labels=False)
    assert [s["key"] for s in other] == ["readme.txt"]


def test_zip_reader_copies_and_pickles(archive):
    reader = ZipFileReader(archive, convertfun=_upper)
    for clone in (copy.copy(reader), pickle.loads(pickle.dumps(reader))):
        assert clone[1]["data"] == b"CAT:2.PNG"
    reader.close()
    assert reader[2]["data"] == b"COW:SUB/4.JPG"


@pytest.fixture
def shards(tmp_path):
    samples = make_samples(25)
    paths = [write(tmp_path / f"part-{i}.msgpack", samples[a:b])
             for i, (a, b) in enumerate([(0, 10), (10, 10), (10, 22), (22, 25)])]
    return samples, paths


def test_sharded_reader_concatenates_shards(shards, tmp_path):
    samples, paths = shards
    for reader in (ShardedReader(paths), ShardedReader(str(tmp_path / "part-*.msgpack")),
                   ShardedReader([MsgpackReader(p) for p in paths])):
        assert len(reader) == 25 and list(reader) == samples
        assert reader[8:13] == samples[8:13] and reader[-1] == samples[-1]
        assert list(reader.iter(5, 24, chunk_size=4)) == samples[5:24]
        assert reader.get_many([24, 0, 11, 12]) == [samples[i] for i in (24, 0, 11, 12)]
        assert reader.find_index("s00023") == 23 and reader.find_key(12) == "s00012"
        assert "s00011" in reader and "x" not in reader
        assert reader.get(11, yield_key=True, raw=True) == ("s00011", pack_sample(samples[11]))


def test_sharded_reader_matches_datadings_and_pickles(shards):
    samples, paths = shards
    non_empty = [paths[0], *paths[2:]]  # datadings fails on an empty shard
    ours, theirs = ShardedReader(non_empty), DatadingsShardedReader(non_empty)
    assert list(ours.iter(3, 23)) == list(theirs.iter(3, 23))
    clone = pickle.loads(pickle.dumps(ours))
    assert clone[:] == samples
    with ours:
        assert ours[0] == samples[0]


def test_sharded_reader_argument_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset matches"):
        ShardedReader(str(tmp_path / "*.msgpack"))
    with pytest.raises(TypeError, match="paths or readers"):
        ShardedReader([3])
    empty = ShardedReader([])
    assert len(empty) == 0 and list(empty) == []
    with pytest.raises(KeyError):
        empty.find_index("a")


def test_zip_reader_reads_list_files_of_members(archive, tmp_path):
    listing = tmp_path / "members.tsv"
    listing.write_text("dog/3.jpg\tcanine\ncat/1.jpg\tfeline\n")
    reader = ZipFileReader(archive, patterns=[str(listing)])
    assert [(s["key"], s["_label"], s["data"]) for s in reader] == [
        ("dog/3.jpg", "canine", b"dog:3.jpg"), ("cat/1.jpg", "feline", b"cat:1.jpg")]


def test_natural_label_order_handles_numbers_and_mixed_text():
    reader = ListReader([{"label": label} for label in ["x10", "x9", 3, "10", "9", "x"]])
    assert reader.labels == [3, "9", "10", "x", "x9", "x10"]
