"""MsgpackReader: the reader API, missing files, corrupt files, verification, pickling."""

import copy
import os
import pickle
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pytest

from fpipe.dataset import FileWriter, MsgpackReader, ShardedReader, pack_sample
from fpipe.dataset import reader as reader_module
from fpipe.errors import FormatError

from .conftest import make_samples, write


def test_lookup_api(dataset, samples):
    reader = MsgpackReader(dataset)
    assert len(reader) == 50
    assert "s00007" in reader and "nope" not in reader and 7 not in reader
    assert reader.find_index("s00007") == 7 and reader.find_key(7) == "s00007"
    assert reader.find_key(-1) == "s00049"
    with pytest.raises(KeyError):
        reader.find_index("nope")
    with pytest.raises(KeyError):
        reader.find_index(7)
    with pytest.raises(IndexError):
        reader.find_key(50)


# Lone surrogates: UTF-8 cannot encode them, so no dataset holds such a key (a non-UTF-8 byte
# in a command-line argument arrives as one, "\udcff").
UNENCODABLE = ["\ud800", "s00007\udcff", "\udfff" * 3]


def _assert_absent(reader, key):
    assert key not in reader
    with pytest.raises(KeyError) as raised:
        reader.find_index(key)
    assert raised.value.args == (key,)
    with pytest.raises(KeyError):
        reader.seek_key(key)


@pytest.mark.parametrize("key", UNENCODABLE)
def test_a_key_utf8_cannot_encode_is_absent_not_an_error(dataset, key):
    fresh = MsgpackReader(dataset)
    _assert_absent(fresh, key)  # the Bloom filter answers first
    loaded = MsgpackReader(dataset)
    assert loaded.find_index("s00007") == 7
    _assert_absent(loaded, key)  # the key hashes answer
    _remove(dataset, ".filter")
    _assert_absent(MsgpackReader(dataset), key)


@pytest.mark.parametrize("key", UNENCODABLE)
def test_a_key_utf8_cannot_encode_is_absent_from_legacy_and_sharded_readers(tmp_path, dataset,
                                                                           samples, key):
    legacy = MsgpackReader(_write_legacy(tmp_path / "old.msgpack", samples[:5]))
    _assert_absent(legacy, key)
    _assert_absent(ShardedReader([legacy, dataset]), key)


def test_get_variants(dataset, samples):
    reader = MsgpackReader(dataset)
    assert reader.get(3) == samples[3] == reader[3]
    assert reader.get(-1) == samples[-1] == reader[-50 + 49]
    assert reader.get(np.int64(4)) == samples[4]
    assert reader.get(5, yield_key=True) == ("s00005", samples[5])
    assert reader.get(5, raw=True) == pack_sample(samples[5])
    view = reader.get(5, raw=True, copy=False)
    assert bytes(view) == pack_sample(samples[5])
    for bad in (50, -51):
        with pytest.raises(IndexError, match="out of range for 50 samples"):
            reader.get(bad)
    for bad in ("1", 1.0, None):
        with pytest.raises(TypeError, match="indices must be integers"):
            reader.get(bad)


def test_slicing_returns_lists_with_python_clamping(dataset, samples):
    reader = MsgpackReader(dataset)
    for key in [slice(3, 9), slice(-5, None), slice(None, 100), slice(40, 10), slice(0, 50, 7),
                slice(None, None, -3), slice(45, 2, -10), slice(100, 200)]:
        assert reader[key] == samples[key], key
    assert reader.get_slice(-3, None) == samples[-3:]
    assert reader.get_slice(2, 5, yield_key=True) == [(s["key"], s) for s in samples[2:5]]
    assert reader.get_slice(2, 5, raw=True) == [pack_sample(s) for s in samples[2:5]]
    views = reader.get_slice(2, 5, raw=True, copy=False)
    assert [bytes(v) for v in views] == reader.get_slice(2, 5, raw=True)
    assert list(reader.slice(45)) == samples[45:] and list(reader.slice(2, 4)) == samples[2:4]


def test_get_many_keeps_order_repeats_and_coalesces_runs(dataset, samples, monkeypatch):
    reader = MsgpackReader(dataset)
    calls = []
    real = MsgpackReader.get_slice

    def spy(self, start, stop, *args):
        calls.append((start, stop))
        return real(self, start, stop, *args)
    monkeypatch.setattr(MsgpackReader, "get_slice", spy)
    indices = [9, 3, 4, 5, -1, 3, 20, 10]
    got = reader.get_many(indices)
    assert got == [samples[i] for i in indices]
    assert got[1] is not got[5]
    assert sorted(calls) == [(3, 6), (9, 11)]
    assert reader.get_many([]) == []
    assert reader.get_many([1, 2], yield_key=True, raw=True) == [
        (s["key"], pack_sample(s)) for s in samples[1:3]]
    with pytest.raises(IndexError):
        reader.get_many([1, 50])


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 16, 49, 50, 1000])
def test_iteration_is_the_same_for_every_chunk_size(dataset, samples, chunk_size):
    reader = MsgpackReader(dataset)
    assert list(reader.iter(chunk_size=chunk_size)) == samples
    assert list(reader.iter(7, 31, chunk_size=chunk_size)) == samples[7:31]
    assert list(reader.iter(yield_key=True, raw=True, chunk_size=chunk_size)) == [
        (s["key"], pack_sample(s)) for s in samples]
    views = list(reader.iter(raw=True, copy=False, chunk_size=chunk_size))
    assert [bytes(v) for v in views] == [pack_sample(s) for s in samples]


@pytest.mark.parametrize("start, stop", [(None, None), (-5, None), (-100, 3), (10, -10), (49, None),
                                         (50, None), (60, 70), (30, 10), (0, 0)])
def test_iter_follows_range_over_a_slice(dataset, samples, start, stop):
    assert list(MsgpackReader(dataset).iter(start, stop)) == samples[start:stop]


@pytest.mark.parametrize(("chunk_size", "error"), [(0, ValueError), (-1, ValueError),
                                                   (1.5, TypeError), (True, TypeError)])
def test_bad_chunk_size_is_rejected_at_call(dataset, chunk_size, error):
    with pytest.raises(error, match="chunk_size"):
        MsgpackReader(dataset).iter(chunk_size=chunk_size)


def test_iterators_are_independent(dataset, samples):
    reader = MsgpackReader(dataset)
    a, b = iter(reader), iter(reader)
    first = [next(a) for _ in range(3)]
    second = [next(b) for _ in range(3)]
    assert first == second == samples[:3] and next(a) == samples[3]
    assert list(reader) == samples and list(reader) == samples


def test_seek_and_next_keep_datadings_cursor_semantics(dataset, samples):
    reader = MsgpackReader(dataset)
    reader.seek(45)
    assert list(reader) == samples[45:]
    assert list(reader) == samples
    reader.seek_key("s00048")
    assert reader.next() == samples[48] and next(reader) == samples[49]
    with pytest.raises(StopIteration):
        reader.next()
    assert next(iter(reader)) == samples[0]
    reader.seek(-1)
    assert reader.rawnext() == pack_sample(samples[49])
    assert list(reader.rawiter(yield_key=True))[0] == ("s00000", pack_sample(samples[0]))
    with pytest.raises(IndexError):
        reader.seek(50)


def test_large_samples(tmp_path):
    samples = make_samples(20, size=70_000)
    path = write(tmp_path / "big.msgpack", samples)
    reader = MsgpackReader(path)
    assert reader[7] == samples[7] and reader[3:9] == samples[3:9]
    assert list(reader.iter(chunk_size=3)) == samples
    assert isinstance(reader.get(2, raw=True, copy=False), memoryview)
    assert reader.get(2, raw=True, copy=False) == pack_sample(samples[2])


def test_an_offsets_file_too_big_to_hold_is_read_two_offsets_per_get(tmp_path, monkeypatch):
    samples = make_samples(30, size=50)
    reader = MsgpackReader(write(tmp_path / "x.msgpack", samples))
    monkeypatch.setattr(reader_module, "_RESIDENT_OFFSETS", 8 * 30)  # 31 offsets do not fit
    assert reader[29] == samples[29] and reader[-30] == samples[0]
    assert reader[4:9] == samples[4:9] and list(reader.iter(chunk_size=7)) == samples
    assert reader._handle.offsets is None and reader.verify_data()


def test_many_samples_cross_offset_windows_and_read_blocks(tmp_path):
    samples = make_samples(reader_module._OFFSETS_WINDOW * 2 + 5, size=100)
    path = write(tmp_path / "many.msgpack", samples)
    reader = MsgpackReader(path)
    assert list(reader) == samples
    assert list(reader.iter(4000, 4200, chunk_size=7)) == samples[4000:4200]
    assert list(reader.iter(yield_key=True, chunk_size=5000))[-1] == (samples[-1]["key"], samples[-1])


def test_empty_dataset(tmp_path):
    path = write(tmp_path / "empty.msgpack", [])
    reader = MsgpackReader(path)
    assert len(reader) == 0 and list(reader) == [] and reader[:] == [] and "a" not in reader
    assert list(reader.iter(0, 10)) == [] and reader.get_many([]) == [] and reader.verify_data()
    with pytest.raises(IndexError):
        reader.get(0)


def test_context_manager_and_close_keep_the_reader_usable(dataset, samples):
    with MsgpackReader(dataset) as reader:
        iterator = iter(reader)
        assert next(iterator) == samples[0]
    assert reader._handle is None
    assert list(iterator) == samples[1:]
    assert reader[1] == samples[1]


def test_pickle_and_copy_reopen_the_files(dataset, samples):
    reader = MsgpackReader(dataset)
    assert reader[0] == samples[0] and reader.find_index("s00003") == 3
    for clone in (pickle.loads(pickle.dumps(reader)), copy.copy(reader), copy.deepcopy(reader)):
        assert clone._handle is None and clone._keys._table is None
        assert clone[5] == samples[5] and list(clone) == samples and "s00009" in clone
    assert len(pickle.dumps(reader)) < 500
    assert repr(reader) == f"MsgpackReader({dataset!r})"


def _remove(path, suffix):
    os.remove(path + suffix)


def test_missing_data_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file") as raised:
        MsgpackReader(tmp_path / "nope.msgpack")
    assert raised.value.filename == str(tmp_path / "nope.msgpack")


def test_missing_offsets_and_index(dataset):
    _remove(dataset, ".offsets")
    with pytest.raises(FileNotFoundError, match="set.msgpack.offsets or set.msgpack.index"):
        MsgpackReader(dataset)


def test_missing_keys_only_breaks_key_lookups(dataset, samples):
    _remove(dataset, ".keys")
    reader = MsgpackReader(dataset)
    assert len(reader) == 50 and list(reader) == samples
    with pytest.warns(UserWarning, match="key_index: the dataset has no .keys file"):
        assert "s00001" in reader
    assert reader.find_index("s00002") == 2
    with pytest.raises(FileNotFoundError, match="keys"):
        reader.find_key(1)
    with pytest.raises(FileNotFoundError, match="keys"):
        reader.get(1, yield_key=True)


def test_missing_key_hashes_are_recomputed(dataset):
    _remove(dataset, ".key_hashes")
    reader = MsgpackReader(dataset)
    assert reader.find_index("s00031") == 31 and "s00031" in reader and "x" not in reader


def test_missing_filter_leaves_in_working(dataset):
    _remove(dataset, ".filter")
    reader = MsgpackReader(dataset)
    assert "s00031" in reader and "x" not in reader


def test_missing_md5_only_breaks_verification(dataset, samples):
    _remove(dataset, ".md5")
    reader = MsgpackReader(dataset)
    assert reader[:] == samples
    with pytest.raises(FileNotFoundError):
        reader.verify_data()


def _write_legacy(data, samples):
    """A dataset with only datadings's old ``.index`` (key -> offset), no ``.offsets``."""
    packed = [pack_sample(s) for s in samples]
    data.write_bytes(b"".join(packed))
    starts = np.cumsum([0] + [len(p) for p in packed[:-1]]).tolist()
    data.with_name(data.name + ".index").write_bytes(
        msgpack.packb(dict(zip((s["key"] for s in samples), starts))))
    return data


def test_legacy_index_datasets_read(tmp_path, samples):
    reader = MsgpackReader(_write_legacy(tmp_path / "old.msgpack", samples))
    assert len(reader) == 50 and list(reader) == samples and reader[-3:] == samples[-3:]
    assert reader.find_index("s00020") == 20 and "s00020" in reader and reader.find_key(4) == "s00004"
    assert list(reader.iter(yield_key=True, chunk_size=7))[9] == ("s00009", samples[9])


def test_a_corrupt_legacy_index_raises_format_error(tmp_path):
    (tmp_path / "old.msgpack").write_bytes(b"\xc0")
    (tmp_path / "old.msgpack.index").write_bytes(b"\xc1")
    with pytest.raises(FormatError, match="legacy index"):
        MsgpackReader(tmp_path / "old.msgpack")


def _assert_format_error(error, path, index, offset):
    assert (str(error.path), error.index, error.offset) == (str(path), index, offset)


def test_truncated_data_fails_at_the_cut_sample_only(dataset, samples):
    offsets = [0, *np.cumsum([len(pack_sample(s)) for s in samples]).tolist()]
    os.truncate(dataset, offsets[-1] - 4)
    reader = MsgpackReader(dataset)
    assert reader[:48] == samples[:48] and reader.get(48, raw=True) == pack_sample(samples[48])
    for read in (lambda: reader.get(49), lambda: reader.get(49, raw=True), lambda: reader[45:],
                 lambda: list(reader.iter(chunk_size=7))):
        with pytest.raises(FormatError, match="truncated") as raised:
            read()
        _assert_format_error(raised.value, dataset, 49, offsets[49])
    iterator, seen = iter(reader), []
    with pytest.raises(FormatError):
        for sample in iterator:
            seen.append(sample)
    assert seen == samples[:49]
    assert not reader.verify_data()


def test_a_corrupt_sample_raises_format_error_and_neighbours_still_read(dataset, samples):
    offsets = [0, *np.cumsum([len(pack_sample(s)) for s in samples]).tolist()]
    data = bytearray(open(dataset, "rb").read())
    data[offsets[10]] = 0x84  # the map now claims four entries: it swallows the next sample's bytes
    open(dataset, "wb").write(data)
    reader = MsgpackReader(dataset)
    for read in (lambda: reader.get(10), lambda: reader[8:12], lambda: list(reader.iter(chunk_size=3)),
                 lambda: list(reader.iter(chunk_size=50))):
        with pytest.raises(FormatError, match="corrupt sample") as raised:
            read()
        _assert_format_error(raised.value, dataset, 10, offsets[10])
    assert reader[9] == samples[9] and reader[11] == samples[11] and not reader.verify_data()


def test_a_corrupt_length_prefix_fails_fast_without_allocating(tmp_path):
    header = b"\x81\xa4data\xc6"
    (tmp_path / "x.msgpack").write_bytes(header + b"\xff\xff\xff\xf0" + b"\x00" * 20)
    from fpipe.dataset.format import write_index
    write_index(tmp_path / "x.msgpack", ["a"], [0, len(header) + 24], "0" * 32)
    reader = MsgpackReader(tmp_path / "x.msgpack")
    for read in (lambda: reader.get(0), lambda: list(reader), lambda: reader[:]):
        with pytest.raises(FormatError):
            read()


def test_decreasing_offsets_raise_format_error(tmp_path):
    data = pack_sample({"key": "a"}) + pack_sample({"key": "b"})
    (tmp_path / "x.msgpack").write_bytes(data)
    from fpipe.dataset.format import write_index
    write_index(tmp_path / "x.msgpack", ["a", "b"], [0, 20, 7], "0" * 32)
    reader = MsgpackReader(tmp_path / "x.msgpack")
    for read in (lambda: reader.get(1), lambda: reader.get(1, raw=True), lambda: list(reader),
                 lambda: list(reader.iter(raw=True))):
        with pytest.raises(FormatError):
            read()


def test_extended_data_reads_but_fails_verification(dataset, samples):
    with open(dataset, "ab") as file:
        file.write(b"garbage")
    reader = MsgpackReader(dataset)
    assert list(reader) == samples and not reader.verify_data() and reader.verify_index()


def test_verify_index_detects_changed_index_files(dataset):
    reader = MsgpackReader(dataset)
    assert reader.verify_index()
    with open(dataset + ".filter", "r+b") as file:
        file.seek(40)
        file.write(b"\xff")
    assert not reader.verify_index()


@pytest.mark.parametrize("content, match", [(b"\x00" * 12, "n \\+ 1 uint64"), (b"", "n \\+ 1 uint64")])
def test_malformed_offsets_fail_at_open(dataset, content, match):
    open(dataset + ".offsets", "wb").write(content)
    with pytest.raises(FormatError, match=match):
        MsgpackReader(dataset)


def test_inconsistent_index_files_raise_format_error(dataset):
    hashes = open(dataset + ".key_hashes", "rb").read()
    open(dataset + ".key_hashes", "wb").write(hashes[:-8])
    open(dataset + ".keys", "wb").write(msgpack.packb(["a", "b"]))
    reader = MsgpackReader(dataset)
    with pytest.raises(FormatError, match="49 key hashes for 50 samples"), \
            pytest.warns(UserWarning, match="key_index: it indexes other keys"):
        reader.find_index("s00001")
    with pytest.raises(FormatError, match="2 keys for 50 samples"):
        reader.find_key(0)


def test_writer_and_reader_share_a_file_without_confusion(tmp_path):
    path = tmp_path / "x.msgpack"
    with FileWriter(path) as writer:
        writer.write({"key": "a", "array": np.arange(3)})
    sample = MsgpackReader(path)[0]
    assert sample["array"].tolist() == [0, 1, 2] and sample["array"].flags.writeable
    assert not MsgpackReader(path).get(0, copy=False)["array"].flags.writeable


def test_a_corrupt_filter_or_md5_without_entry_raises_format_error(dataset):
    open(dataset + ".filter", "wb").write(b"SIMPBLOO" + bytes(30))
    assert "s00001" in MsgpackReader(dataset)  # the key index answers; the filter is not read
    os.remove(dataset + ".key_index")
    with pytest.raises(FormatError, match="Bloom filter"):
        MsgpackReader(dataset).__contains__("s00001")
    open(dataset + ".md5", "w").write("00  other.msgpack\n")
    with pytest.raises(FormatError, match="no entry for set.msgpack"):
        MsgpackReader(dataset).verify_data()


def test_an_offsets_file_that_shrinks_while_open_raises_format_error(dataset):
    reader = MsgpackReader(dataset)
    assert next(reader.iter(0, 1)) is not None  # opens the files with 51 offsets, reads two
    os.truncate(dataset + ".offsets", 80)
    with pytest.raises(FormatError, match="shrank") as raised:
        list(reader.iter(20))
    assert raised.value.path == Path(dataset + ".offsets")
    with pytest.raises(FormatError, match="shrank"):
        reader.get(30)


def test_offsets_read_into_memory_outlive_their_file(dataset):
    reader = MsgpackReader(dataset)
    expected = list(reader)
    assert reader[0] == expected[0]  # the first get reads all offsets
    os.truncate(dataset + ".offsets", 80)
    assert list(reader.iter(20)) == expected[20:] and reader[30] == expected[30]


def test_a_reader_reopens_its_data_file_copied_with_its_size_and_time(dataset):
    # another inode, the same size and modification time (as a FUSE file system that numbers
    # files anew, or cp -p, may show it): the same file to the reader, no false alarm
    reader = MsgpackReader(dataset)
    expected = reader[1]
    reader.close()
    shutil.copy2(dataset, dataset + ".copy")
    os.replace(dataset + ".copy", dataset)
    assert reader[1] == expected and pickle.loads(pickle.dumps(reader))[1] == expected


def test_a_reader_refuses_a_data_file_changed_since_it_was_made(dataset):
    reader = MsgpackReader(dataset)
    os.utime(dataset, ns=(0, 0))
    with pytest.raises(FormatError, match="changed since the reader was made") as raised:
        reader.get(0)
    assert raised.value.path == Path(dataset)
