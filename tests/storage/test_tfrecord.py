"""TFRecord: fpipe's framing and Example codec against the tfrecord package (which writes what
fpipe reads, and reads what fpipe writes), the CRC-32C fallbacks, damaged files."""

import gzip
import os
import pickle
import shutil
import struct
import types

import numpy as np
import pytest
import tfrecord
import torch
from tfrecord.reader import tfrecord_loader

import fpipe.torch
from fpipe.errors import FormatError
from fpipe.formats import (
    TFRecordFileReader,
    TFRecordReader,
    TFRecordWriter,
    encode_example,
    parse_example,
)
from fpipe.formats._crc32c import crc32c, numpy_crc32c, python_crc32c
from fpipe.remote import RemoteOptions


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def _features(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"image": rng.bytes(int(rng.integers(0, 5000))), "label": [i - 3, 2**40, -2**63],
            "box": rng.random(4).astype(np.float32).tolist(), "text": b"caption %d" % i}


@pytest.fixture
def written_by_tfrecord(tmp_path):
    path = tmp_path / "theirs.tfrecord"
    writer = tfrecord.TFRecordWriter(str(path))
    for i in range(30):
        f = _features(i)
        writer.write({"image": (f["image"], "byte"), "label": (f["label"], "int"),
                      "box": (f["box"], "float"), "text": (f["text"], "byte")})
    writer.close()
    return path


def test_reads_what_the_tfrecord_package_writes(written_by_tfrecord, cache):
    reader = TFRecordFileReader(written_by_tfrecord, remote=RemoteOptions(cache_dir=cache))
    theirs = list(tfrecord_loader(str(written_by_tfrecord), None))
    assert len(reader) == 30
    for ours, their in zip(reader, theirs):
        assert ours.keys() == their.keys()
        for name in ours:
            np.testing.assert_array_equal(ours[name], their[name])
            assert type(ours[name]) is type(their[name])
    assert reader.get(7)["label"].tolist() == [4, 2**40, -2**63]


def test_the_tfrecord_package_reads_what_fpipe_writes(tmp_path, cache):
    path = tmp_path / "ours.tfrecord"
    with TFRecordWriter(path) as writer:
        for i in range(20):
            writer.write(_features(i))
    theirs = list(tfrecord_loader(str(path), None))
    ours = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    for i, their in enumerate(theirs):
        features = _features(i)
        assert their["image"] == features["image"] == ours[i]["image"]
        assert their["label"].tolist() == features["label"] == ours[i]["label"].tolist()
        np.testing.assert_array_equal(their["box"], np.float32(features["box"]))
        np.testing.assert_array_equal(ours[i]["box"], np.float32(features["box"]))


def test_example_codec_round_trip_and_types():
    features = {"one": b"x", "many": [b"a", b"", b"c"],
                "ints": np.array([0, -1, 127, 128, -2**63, 2**63 - 1]),
                "floats": np.array([1.5, -0.0, np.inf], np.float32), "empty": [], "flag": True,
                "word": "héllo", "words": ["a", "b"]}
    back = parse_example(encode_example(features))
    assert back["one"] == b"x" and back["many"] == [b"a", b"", b"c"]
    assert back["ints"].dtype == np.int64 and back["ints"].tolist() == features["ints"].tolist()
    assert back["floats"].dtype == np.float32 and back["floats"].tobytes() == features["floats"].tobytes()
    assert back["empty"].size == 0 and back["flag"].tolist() == [1]
    assert back["word"] == "héllo".encode() and back["words"] == [b"a", b"b"]
    with pytest.raises(TypeError, match="feature 'bad' holds dict"):
        encode_example({"bad": {"a": 1}})
    with pytest.raises(TypeError, match="feature 'big'"):
        encode_example({"big": np.array([2**64 - 1], np.uint64)})


@pytest.mark.parametrize("data", [b"\x0a", b"\x0a\x05\x0a\x03", b"\x0b", b"\x0a\x02\x0a\xff"])
def test_parse_example_refuses_what_is_not_an_example(data):
    with pytest.raises(ValueError):
        parse_example(data)


def _message(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (of a number below 16)."""
    length, size = bytearray(), len(payload)
    while size >= 0x80:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    return bytes([field << 3 | 2, *length, size]) + payload


def _example_of_int64s(name: bytes, int64_list: bytes) -> bytes:
    """An Example of one feature ``name`` whose Int64List message is ``int64_list``."""
    entry = _message(1, name) + _message(2, _message(3, int64_list))
    return _message(1, _message(1, entry))


@pytest.mark.parametrize("int64_list", [
    _message(1, b"\xff" * 9 + b"\x7f"),   # packed
    b"\x08" + b"\xff" * 9 + b"\x7f",      # not packed
    _message(1, b"\x05" + b"\xff" * 9 + b"\x03"),
])
def test_a_varint_past_64_bits_reads_its_low_64_bits_as_protobuf_does(int64_list, tmp_path, cache):
    from tfrecord import example_pb2

    data = _example_of_int64s(b"ids", int64_list)
    theirs = example_pb2.Example.FromString(data).features.feature["ids"].int64_list.value
    assert parse_example(data)["ids"].tolist() == list(theirs)
    with TFRecordWriter(tmp_path / "x.tfrecord") as writer:
        writer.write_record(data)
    assert TFRecordFileReader(tmp_path / "x.tfrecord",
                              remote=RemoteOptions(cache_dir=cache))[0]["ids"].tolist() == list(theirs)


def test_the_feature_names_kept_for_the_next_records_stay_bounded():
    from fpipe.formats import tfrecord

    for i in range(tfrecord._KNOWN_NAMES + 100):
        assert parse_example(encode_example({f"name {i}": i}))[f"name {i}"].tolist() == [i]
    assert len(tfrecord._NAMES) == tfrecord._KNOWN_NAMES


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 31, 32, 33, 1000, 2049, 70001])
def test_crc32c_fallbacks_agree_with_the_crc32c_package(size):
    data = np.random.default_rng(size).bytes(size)
    assert python_crc32c(data) == numpy_crc32c(data) == crc32c(data)


def test_sharded_patterns_keys_and_slices(tmp_path, cache):
    for shard in range(3):
        with TFRecordWriter(tmp_path / f"train-{shard:05d}-of-00003") as writer:
            for i in range(10):
                writer.write({"n": shard * 100 + i})
    reader = TFRecordReader(str(tmp_path / "train-{00000..00002}-of-00003"),
                            remote=RemoteOptions(cache_dir=cache))
    assert len(reader) == 30 and [int(s["n"][0]) for s in reader.iter(8, 12)] == [8, 9, 100, 101]
    assert reader.find_key(12) == "train-00001-of-00003:2"
    assert reader.find_index("train-00002-of-00003:9") == 29
    assert "train-00002-of-00003:10" not in reader and "train-00002-of-00003:01" not in reader
    assert [int(s["n"][0]) for s in reader[29:20:-4]] == [209, 205, 201]
    assert pickle.loads(pickle.dumps(reader))[15]["n"].tolist() == [105]


def test_features_chooses_and_a_missing_one_names_file_record_and_feature(tmp_path, cache):
    path = tmp_path / "f.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write({"image": b"a", "label": 1})
        writer.write({"image": b"b"})
        writer.write({"image": b"c", "label": 0, "extra": 5})
    reader = TFRecordFileReader(path, features=["image", "label"], remote=RemoteOptions(cache_dir=cache))
    assert reader[2] == {"image": b"c", "label": reader[2]["label"]} and reader[2]["label"].tolist() == [0]
    missing = r"f\.tfrecord: sample 1 at byte \d+: the record has no feature 'label'"
    with pytest.raises(FormatError, match=missing):
        reader[1]


def _records(path, n):
    with TFRecordWriter(path) as writer:
        for i in range(n):
            writer.write({"i": i, "pad": b"x" * 100})
    return path.read_bytes()


def test_bad_data_crc_raises_for_that_record_only(tmp_path, cache):
    path = tmp_path / "crc.tfrecord"
    data = bytearray(_records(path, 5))
    record = len(data) // 5
    data[2 * record + 40] ^= 1  # inside record 2's data
    path.write_bytes(bytes(data))
    reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    assert len(reader) == 5 and reader[3]["i"].tolist() == [3]
    bad_crc = r"crc\.tfrecord: sample 2 at byte \d+: the CRC of the record's data"
    with pytest.raises(FormatError, match=bad_crc) as error:
        reader[2]
    assert error.value.index == 2 and error.value.offset == 2 * record
    assert [s["i"][0] for s in TFRecordFileReader(path, verify=False,
                                                  remote=RemoteOptions(cache_dir=cache))] == [0, 1, 2, 3, 4]


def test_bad_length_crc_and_truncation_keep_the_records_before(tmp_path, cache):
    path = tmp_path / "len.tfrecord"
    data = bytearray(_records(path, 5))
    record = len(data) // 5
    data[3 * record + 2] ^= 1  # record 3's length
    path.write_bytes(bytes(data))
    reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    assert len(reader) == 4 and [s["i"][0] for s in reader.iter(0, 3)] == [0, 1, 2]
    with pytest.raises(FormatError, match="sample 3 .*the CRC of the record's length"):
        reader[3]
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(_records(tmp_path / "whole.tfrecord", 5)[:-7])
    reader = TFRecordFileReader(cut, remote=RemoteOptions(cache_dir=cache))
    got = []
    with pytest.raises(FormatError, match="sample 4 .*truncated: the record ends at byte"):
        for sample in reader:
            got.append(int(sample["i"][0]))
    assert got == [0, 1, 2, 3]


def test_not_an_example_and_gzip(tmp_path, cache):
    path = tmp_path / "raw.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write_record(b"\x0a\x05")
    with pytest.raises(FormatError, match="sample 0 .*not a tf.train.Example"):
        TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))[0]
    packed = tmp_path / "packed.tfrecord.gz"
    packed.write_bytes(gzip.compress(_records(tmp_path / "plain.tfrecord", 3)))
    with pytest.raises(FormatError, match="gzip-compressed"):
        TFRecordFileReader(packed, remote=RemoteOptions(cache_dir=cache))[0]


def test_a_huge_length_claim_allocates_nothing(tmp_path, cache):
    path = tmp_path / "huge.tfrecord"
    length = struct.pack("<Q", 2**62)
    from fpipe.formats._crc32c import masked_crc32c
    path.write_bytes(length + struct.pack("<I", masked_crc32c(length)) + b"abc")
    reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    with pytest.raises(FormatError, match="truncated"):
        reader[0]


def key_of_label(sample):
    return int(sample["i"][0])


def test_skip_goes_past_a_bad_record_in_dataloader_workers(tmp_path, cache):
    path = tmp_path / "crc.tfrecord"
    data = bytearray(_records(path, 6))
    data[(len(data) // 6) * 4 + 40] ^= 1
    path.write_bytes(bytes(data))
    reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    dataset = fpipe.torch.IterableDataset(reader, transforms=key_of_label,
                                          samples=fpipe.torch.Samples(on_error="skip"))
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2,
                                         multiprocessing_context="spawn")
    assert sorted(int(x) for batch in loader for x in batch) == [0, 1, 2, 3, 5]
    assert dataset.skipped == 1


def test_writer_leaves_nothing_when_its_block_raises(tmp_path):
    path = tmp_path / "x.tfrecord"
    with pytest.raises(RuntimeError), TFRecordWriter(path) as writer:
        writer.write({"a": 1})
        raise RuntimeError
    assert os.listdir(tmp_path) == []
    TFRecordWriter(path).close()
    with pytest.raises(FileExistsError):
        TFRecordWriter(path)


def _protobuf_reads(data: bytes):
    """What protobuf makes of ``data`` as an Example, as fpipe gives features, or "error"."""
    from google.protobuf.message import DecodeError
    from tfrecord import example_pb2

    try:
        example = example_pb2.Example.FromString(data)
    except DecodeError:
        return "error"
    features = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else None
        features[name] = (None if kind is None else np.array(values, np.float32)
                          if kind == "float_list" else np.array(values, np.int64)
                          if kind == "int64_list" else values[0] if len(values) == 1 else values)
    return features


def _fpipe_reads(data: bytes):
    try:
        return parse_example(data)
    except ValueError:
        return "error"


def _group(number: int, inside: bytes = b"") -> bytes:
    return bytes([number << 3 | 3]) + inside + bytes([number << 3 | 4])


_ONE, _TWO = _message(3, _message(1, b"\x01")), _message(3, _message(1, b"\x02"))


@pytest.mark.parametrize("data", [
    _message(1, _message(1, _message(1, b"a") + _message(2, _ONE + _TWO))),  # a list twice
    _message(1, _message(1, _message(1, b"a") + _message(2, _ONE) + _message(2, _TWO))),
    _message(1, _message(1, _message(1, b"a") + _message(2, _ONE))
             + _message(1, _message(1, b"a") + _message(2, _TWO))),  # an entry twice: the last
    _message(1, _message(1, _message(1, b"a") + _message(2, _ONE + _message(1, b"") + _TWO))),
    _message(1, _message(1, _message(1, b"a") + _message(2, _ONE))) + _message(
        1, _message(1, _message(1, b"b") + _message(2, _TWO))),  # Example.features merges
    b"\x00\x01", b"\x08\x01\x00\x01", _message(1, b"\x00\x01"),  # field number 0
    b"\x26\x00", b"\x27\x00", b"\x24", _group(4, b"\x2c"),  # wire types 6, 7; ends of groups
    _group(4), _group(4, _group(5, b"\x28\x01")) + _example_of_int64s(b"x", b"\x08\x05"),
    _message(1, _message(1, _message(1, b"a") + _message(2, _message(3, _group(2) + b"\x08\x07")))),
    b"\x88\x80\x80\x80\x00\x01", b"\x88\x80\x80\x80\x10\x01",  # tags of 5 bytes, 32 bits or more
    b"\x0a\x80\x80\x80\x80\x00", b"\x0a\x80\x80\x80\x80\x80\x00",  # lengths of 5 and 6 bytes
    bytes([4 << 3 | 3]) * 100 + bytes([4 << 3 | 4]) * 100,  # as deep as groups may nest
    bytes([4 << 3 | 3]) * 101 + bytes([4 << 3 | 4]) * 101,  # deeper
    _example_of_int64s(b"x", bytes([2 << 3 | 3]) * 96 + bytes([2 << 3 | 4]) * 96),
    _example_of_int64s(b"x", bytes([2 << 3 | 3]) * 97 + bytes([2 << 3 | 4]) * 97),
])
def test_parse_example_merges_and_refuses_as_protobuf_does(data):
    ours, theirs = _fpipe_reads(data), _protobuf_reads(data)
    assert type(ours) is type(theirs) and (ours == theirs if isinstance(ours, str) else
                                           ours.keys() == theirs.keys())
    for name in theirs if isinstance(theirs, dict) else ():
        np.testing.assert_array_equal(ours[name], theirs[name])
        assert type(ours[name]) is type(theirs[name])


def test_a_feature_list_that_comes_twice_merges():
    data = _message(1, _message(1, _message(1, b"a") + _message(2, _ONE + _TWO)))
    assert parse_example(data)["a"].tolist() == [1, 2]


def _records_of(path, texts) -> None:
    with TFRecordWriter(str(path)) as writer:
        for text in texts:
            writer.write({"text": text})


@pytest.mark.parametrize("change_time", ["seen", "the same"])
def test_a_file_copied_over_keeping_size_and_times_gets_a_new_index(tmp_path, cache, monkeypatch,
                                                                    change_time):
    path, other = tmp_path / "x.tfrecord", tmp_path / "other.tfrecord"
    _records_of(path, [b"a" * 10, b"b" * 40, b"c" * 20])
    _records_of(other, [b"d" * 40, b"e" * 20, b"f" * 10])  # the same size, records elsewhere
    assert path.stat().st_size == other.stat().st_size
    if change_time == "the same":  # a file system whose change times do not tell (the digest does)
        import fpipe.formats._foreign as foreign

        real = foreign._stat_file
        monkeypatch.setattr(foreign, "_stat_file", lambda name: types.SimpleNamespace(
            **{field: getattr(real(name), field) for field in ("st_size", "st_mtime_ns", "st_ino")},
            st_ctime_ns=0))
    assert TFRecordFileReader(path, verify=False,
                              remote=RemoteOptions(cache_dir=cache))[1] == {"text": b"b" * 40}
    inode, times = path.stat().st_ino, (path.stat().st_atime_ns, path.stat().st_mtime_ns)
    shutil.copyfile(other, path)  # as cp -p does: the same file, its times put back
    os.utime(path, ns=times)
    assert path.stat().st_ino == inode
    reader = TFRecordFileReader(path, verify=False, remote=RemoteOptions(cache_dir=cache))
    assert [reader[i] for i in range(len(reader))] == [{"text": b"d" * 40}, {"text": b"e" * 20},
                                                       {"text": b"f" * 10}]
