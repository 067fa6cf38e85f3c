"""The key index: written with every dataset, read with a few preads instead of tables in
memory, added to datasets that lack it, left aside when stale or damaged; and the
writers' bounded memory that builds it (keys checked at close past the window)."""

import os
import tracemalloc
import warnings

import numpy as np
import pytest
from datadings.reader import MsgpackReader as DatadingsReader
from datadings.writer import FileWriter as DatadingsWriter

import fpipe.dataset._indexing as indexing
import fpipe.dataset.format as fmt
import fpipe.dataset.keyindex as hashing
import fpipe.dataset.keyindex as keyindex
import fpipe.dataset.writer as writer_module
from fpipe.dataset import (
    FileWriter,
    MsgpackReader,
    RawWriter,
    index_keys,
    key_salt,
    pack_sample,
    rebuild_index,
    write_index,
)
from fpipe.dataset.keyindex import KeyIndex, key_index_size
from fpipe.errors import FormatError
from fpipe.files import DatasetFiles

N = 5000


def write(path, keys, **options):
    with FileWriter(path, **options) as writer:
        for key in keys:
            writer.write({"key": key, "n": len(key)})
    return path


def keys_of(n, prefix="k"):
    return [f"{prefix}{i:07d}-ü" if i % 7 == 0 else f"{prefix}{i:07d}" for i in range(n)]


@pytest.fixture
def dataset(tmp_path):
    return write(tmp_path / "set.msgpack", keys_of(N))


def test_every_dataset_gets_a_key_index_that_answers_both_ways(dataset):
    keys = keys_of(N)
    assert DatasetFiles(dataset).key_index.stat().st_size == key_index_size(N)
    index = KeyIndex.open(DatasetFiles(dataset), N)
    picks = list(range(0, N, 97)) + [N - 1]
    assert [index.find(keys[i]) for i in picks] == picks
    assert [index[i] for i in picks] == [keys[i] for i in picks]
    assert index.keys(10, 20) == keys[10:20] and index.keys(5, 5) == []
    assert index.find("absent") == -1 and index.find("\udcff") == -1


def test_the_reader_looks_keys_up_in_it_without_tables_in_memory(dataset):
    reader = MsgpackReader(dataset)
    keys = keys_of(N)
    tracemalloc.start()
    try:
        found = [reader.find_index(keys[i]) for i in range(0, N, 50)]
        named = [reader.find_key(i) for i in range(0, N, 50)]
        inside = keys[77] in reader and "nope" not in reader
        pairs = list(reader.iter(100, 110, yield_key=True))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == list(range(0, N, 50)) and named == keys[::50] and inside
    assert [key for key, _ in pairs] == keys[100:110]
    assert peak < 200_000  # the tables would take 16 bytes a key and more, and a sort


def test_datadings_reads_it_as_before_and_a_dataset_without_it_works_as_before(dataset):
    theirs = DatadingsReader(dataset)
    assert theirs.find_index(keys_of(N)[123]) == 123 and keys_of(N)[5] in theirs
    os.remove(DatasetFiles(dataset).key_index)
    reader = MsgpackReader(dataset)
    assert reader.find_index(keys_of(N)[4321]) == 4321 and reader.find_key(7) == keys_of(N)[7]


def test_index_keys_adds_it_to_a_dataset_datadings_wrote(tmp_path):
    path = tmp_path / "dd.msgpack"
    with DatadingsWriter(path, disable=True) as writer:
        for key in keys_of(300):
            writer.write({"key": key})
    before = {suffix: (tmp_path / f"dd.msgpack{suffix}").read_bytes()
              for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter")}
    index_keys(path)
    after = {suffix: (tmp_path / f"dd.msgpack{suffix}").read_bytes() for suffix in before}
    assert after == before  # datadings's files stay byte for byte
    assert KeyIndex.open(DatasetFiles(path), 300).find(keys_of(300)[299]) == 299
    assert MsgpackReader(path).verify_index() and MsgpackReader(path).verify_data()


def test_a_key_index_left_stale_by_a_rewrite_is_left_aside_with_a_warning(dataset):
    with DatadingsWriter(dataset, overwrite=True, disable=True) as writer:
        for key in keys_of(N, prefix="z"):  # other keys; datadings leaves .key_index alone
            writer.write({"key": key})
    assert DatasetFiles(dataset).key_index.exists()
    reader = MsgpackReader(dataset)
    with pytest.warns(UserWarning, match="indexes other keys"):
        assert reader.find_index(keys_of(N, prefix="z")[42]) == 42
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader.find_key(3) == keys_of(N, prefix="z")[3]  # said once


def damaged(data: bytearray, damage: str) -> bytearray:
    """The key index ``data`` (of ``N`` samples) with one kind of damage."""
    entries = 64 + 8 * ((1 << keyindex.directory_bits(N)) + 1)
    places = entries + 16 * N
    if damage == "magic":
        data[:8] = b"NOTINDEX"
    elif damage == "truncated":
        del data[-8:]
    elif damage == "directory":
        data[64:72] = (2**63).to_bytes(8, "big")  # the first slot claims to begin far away
        data[72:80] = (2**63).to_bytes(8, "big")
    elif damage == "entries":
        data[entries:entries + 16 * N:16] = bytes(N)  # no stored hash is right any more
        data[entries + 8:entries + 16] = (1).to_bytes(8, "big")
    elif damage == "salt bit":  # every key hashes elsewhere: all absent, once
        data[24] ^= 1
    elif damage == "hash bit":  # the lowest bit of a hash: in its slot, in order, not found
        data[entries + 16 * 100 + 7] ^= 1
    elif damage == "key place":  # key 10 is said to span 2**62 bytes: a MemoryError once
        data[places + 8 * 11:places + 8 * 12] = (2**62).to_bytes(8, "big")
    elif damage == "key place overflow":  # an OverflowError once
        data[places + 8 * 10:places + 8 * 11] = (2**64 - 1).to_bytes(8, "big")
    return data


@pytest.mark.parametrize("damage", ["magic", "truncated", "directory", "entries", "salt bit",
                                    "hash bit", "key place", "key place overflow"])
def test_a_damaged_key_index_is_left_aside_with_a_warning_and_every_key_still_answers(
        dataset, damage):
    """Regression: a flipped bit made a present key absent while the sample read fine, and
    key places claiming huge spans gave MemoryError and OverflowError."""
    path = DatasetFiles(dataset).key_index
    path.write_bytes(bytes(damaged(bytearray(path.read_bytes()), damage)))
    reader, keys = MsgpackReader(dataset), keys_of(N)
    with pytest.warns(UserWarning, match=r"set\.msgpack\.key_index: .*looked up in set\.msgpack\.keys"):
        assert [reader.find_index(key) for key in keys] == list(range(N))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert [reader.find_key(i) for i in range(N)] == keys
        assert all(key in reader for key in keys[::37]) and "absent" not in reader
        assert [key for key, _ in reader.iter(0, 300, yield_key=True)] == keys[:300]
    with warnings.catch_warnings(record=True):  # fresh readers, asked by index first
        assert MsgpackReader(dataset).find_key(10) == keys[10]
        assert [key for key, _ in MsgpackReader(dataset).get_slice(0, 12, True)] == keys[:12]


def test_the_key_index_checks_each_slot_and_block_of_key_places_by_its_checksum(dataset):
    path = DatasetFiles(dataset).key_index
    index = KeyIndex.open(DatasetFiles(dataset), N)
    entries = 64 + 8 * ((1 << keyindex.directory_bits(N)) + 1)
    with open(path, "r+b") as file:  # an index that is still a place in range, and not 900's
        file.seek(entries + 16 * 900 + 15)
        byte = file.read(1)
        file.seek(entries + 16 * 900 + 15)
        file.write(bytes([byte[0] ^ 1]))
    slot_of = {key: keyindex.hash_key(key, index.salt) >> (64 - index.bits) for key in keys_of(N)}
    damaged_slot = next(slot for slot in range(1 << index.bits)
                        if index._read(index._fd, 64 + 8 * slot, 16, path)[8:] >
                        (900).to_bytes(8, "big"))
    with pytest.raises(FormatError, match=f"directory slot {damaged_slot} fails its checksum"):
        index.find(next(key for key, slot in slot_of.items() if slot == damaged_slot))
    places = entries + 16 * N
    with open(path, "r+b") as file:
        file.seek(places + 8 * 130)
        file.write((1).to_bytes(8, "big"))
    with pytest.raises(FormatError, match="places of keys 128 to 192 fail their checksum"):
        index[129]
    assert index[127] == keys_of(N)[127] and index.keys(0, 128) == keys_of(N)[:128]


def test_a_key_index_of_version_1_without_checksums_still_reads(dataset):
    path = DatasetFiles(dataset).key_index
    data = bytearray(path.read_bytes()[:key_index_size(N, version=1)])
    data[8:12], data[56:60] = (1).to_bytes(4, "big"), bytes(4)
    path.write_bytes(bytes(data))
    reader, keys = MsgpackReader(dataset), keys_of(N)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader._keys._on_disk() is not None and reader._keys._on_disk().version == 1
        assert [reader.find_index(key) for key in keys[::7]] == list(range(0, N, 7))
        assert reader.find_key(N - 1) == keys[-1] and "absent" not in reader
    path.write_bytes(bytes(damaged(data, "key place")))
    with pytest.warns(UserWarning, match="key_index: the keys of samples 10 to 11"):
        assert MsgpackReader(dataset).find_key(10) == keys[10]


def test_hash_collisions_move_every_index_to_the_next_salt(tmp_path, monkeypatch):
    real = indexing.salted_hashes

    def colliding(keys, salt):
        hashes = real(keys, salt)
        return hashes & np.uint64(0xFF) if salt == key_salt(0) else hashes
    monkeypatch.setattr(indexing, "salted_hashes", colliding)
    path = write(tmp_path / "x.msgpack", keys_of(1000))
    monkeypatch.undo()
    assert fmt.read_key_hashes(path)[0] == key_salt(1)
    reader = MsgpackReader(path)
    assert reader.find_index(keys_of(1000)[999]) == 999 and reader.verify_index()
    assert DatadingsReader(path).find_index(keys_of(1000)[500]) == 500


def test_a_key_repeated_past_the_window_is_left_out_at_close(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "WINDOW", 3)
    path = tmp_path / "x.msgpack"
    with pytest.raises(ValueError, match="duplicate key.*'d' is sample 3 and sample 5"):
        with FileWriter(path) as writer:
            for key in ["a", "b", "c", "d", "e", "d", "f"]:
                writer.write({"key": key, "v": key * 3})
            with pytest.raises(ValueError, match="duplicate key 'b'"):
                writer.write({"key": "b"})  # in the window: refused at once
    reader = MsgpackReader(path)
    assert [s["key"] for s in reader] == ["a", "b", "c", "d", "e", "f"]
    assert reader.verify_data() and reader.verify_index() and reader.find_index("f") == 5
    assert not list(tmp_path.glob(".fpipe-*"))


def test_an_append_past_the_window_leaves_out_keys_the_dataset_has(tmp_path, monkeypatch):
    path = write(tmp_path / "x.msgpack", ["a", "b", "c", "d"])
    monkeypatch.setattr(writer_module, "WINDOW", 2)  # the dataset's keys are not in memory
    with pytest.raises(ValueError, match="'b' is sample 1 and sample 5"):
        with RawWriter(path, append=True) as writer:
            for key in ["e", "b", "f"]:
                writer.write(key, pack_sample({"key": key}))
    reader = MsgpackReader(path)
    assert [s["key"] for s in reader] == ["a", "b", "c", "d", "e", "f"]
    assert reader.verify_data() and reader.verify_index()


def test_rebuild_and_write_index_refuse_repeated_keys_changing_nothing(tmp_path):
    path = tmp_path / "x.msgpack"
    path.write_bytes(pack_sample({"key": "a"}) + pack_sample({"key": "b"}) + pack_sample({"key": "a"}))
    with pytest.raises(FormatError, match="duplicate key 'a'") as raised:
        rebuild_index(path)
    assert raised.value.index == 2 and sorted(os.listdir(tmp_path)) == ["x.msgpack"]
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        write_index(path, ["a", "b", "a"], [0, 7, 14, 21], "0" * 32)
    assert sorted(os.listdir(tmp_path)) == ["x.msgpack"]


@pytest.mark.slow
def test_a_writer_holds_no_table_of_its_keys(tmp_path, monkeypatch):
    # a window of 1,000 keys, a filter set in place, partitions of 256 KiB: what is left to
    # hold does not grow with the samples (the writer held every key in a dict before)
    monkeypatch.setattr(writer_module, "WINDOW", 1000)
    monkeypatch.setattr(hashing, "_BLOOM_UNPACKED_MAX", 0)
    monkeypatch.setattr(keyindex, "_PENDING", 1 << 18)
    monkeypatch.setattr(keyindex, "_SORTED", 1 << 18)
    n = 600_000
    tracemalloc.start()
    try:
        with RawWriter(tmp_path / "x.msgpack") as writer:
            for i in range(n):
                writer.write(f"key-{i:09d}", b"\xc0")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20  # the keys alone take 40 MB as Python strings
    reader = MsgpackReader(tmp_path / "x.msgpack")
    assert len(reader) == n and reader.find_index(f"key-{n - 1:09d}") == n - 1
    assert reader.verify_index()


def test_no_staging_folder_outlives_a_writer(tmp_path):
    with pytest.raises(RuntimeError):
        with FileWriter(tmp_path / "x.msgpack") as writer:
            writer.write({"key": "a"})
            raise RuntimeError("the block fails")
    assert MsgpackReader(tmp_path / "x.msgpack").find_index("a") == 0
    writer = FileWriter(tmp_path / "y.msgpack")
    writer.write({"key": "a"})
    assert len(list(tmp_path.glob(".fpipe-*"))) == 1  # while it writes
    writer.abandon()
    dropped = FileWriter(tmp_path / "z.msgpack")
    dropped.write({"key": "a"})
    del dropped
    assert not list(tmp_path.glob(".fpipe-*")) and not (tmp_path / "y.msgpack").exists()


def test_the_writers_filter_is_sized_before_it_is_made(monkeypatch):
    """Regression: for_count made the filter of 1 / n false positives first (480 MB at 100M
    keys) and only then the one within BLOOM_MAX_BYTES: the writer's peak at 100M was 602 MB."""
    made = []
    original = hashing.BloomFilter.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self.num_bits // 8)

    monkeypatch.setattr(hashing.BloomFilter, "__init__", recording)
    bloom = hashing.BloomFilter.for_count(20_000_000)  # past the bound: 87 MB uncapped
    assert made == [bloom.num_bits // 8] and made[0] <= hashing.BLOOM_MAX_BYTES


def test_the_checksums_are_written_a_chunk_at_a_time(tmp_path, monkeypatch):
    """The writer reads the file back in chunks of slots and of blocks of key places (at a
    billion samples a list of every checksum would take hundreds of MB): chunks of 3 here,
    and every lookup passes its checks."""
    monkeypatch.setattr(keyindex, "_SUM_SLOTS", 3)
    keys = keys_of(2000)
    reader = MsgpackReader(write(tmp_path / "x.msgpack", keys))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [reader.find_index(key) for key in keys] == list(range(2000))
        assert [reader.find_key(i) for i in range(2000)] == keys
    assert reader._keys._on_disk().bits == 4  # 16 slots: 6 chunks
