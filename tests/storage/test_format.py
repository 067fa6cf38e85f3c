"""The format module: sample codec, key hashing, Bloom filter and index files."""

import hashlib

import msgpack
import msgpack_numpy
import numpy as np
import pytest
from datadings import index as dd_index
from datadings.tools import hash_string
from simplebloom import BloomFilter as SimpleBloom

from fpipe.dataset import format as fmt
from fpipe.dataset import keyindex as hashing
from fpipe.dataset.format import (
    BloomFilter,
    DatasetFiles,
    decode_numpy,
    encode_numpy,
    hash_key,
    hash_keys,
    key_salt,
    pack_sample,
    read_md5,
    unpack_sample,
)
from fpipe.errors import FormatError

from .conftest import same

ARRAYS = [
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.array(3.5),
    np.zeros((0, 4), np.float32),
    np.array([True, False]),
    np.arange(5, dtype=">i4"),
    np.linspace(0, 1, 7, dtype=np.float16),
    np.array([1 + 2j, -3j], np.complex64),
    np.array(["ab", "cde"]),
    np.array([b"x", b"yz"]),
    np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"),
    np.array([5, 7], dtype="timedelta64[ms]"),
    np.arange(24, dtype=np.uint64).reshape(2, 3, 4).transpose(2, 0, 1),
    np.arange(20, dtype=np.int8)[::3],
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    np.array([b"abcd"], dtype="V4"),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_arrays_round_trip_read_only_with_dtype_and_shape(array):
    decoded = unpack_sample(pack_sample({"a": array}))["a"]
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    assert decoded.tobytes() == np.ascontiguousarray(array).tobytes()
    assert not decoded.flags.writeable


# msgpack-numpy cannot pack datetime arrays (no buffer protocol); fpipe packs them, see below.
COMPARABLE = [a for a in ARRAYS if a.dtype.kind not in "Mm" and (a.dtype.kind != "V" or a.dtype.names)]


@pytest.mark.parametrize("array", COMPARABLE, ids=lambda a: f"{a.dtype}{a.shape}")
def test_arrays_pack_byte_for_byte_like_msgpack_numpy(array):
    ours = pack_sample({"a": array})
    theirs = msgpack.packb({"a": array}, default=msgpack_numpy.encode, use_bin_type=True)
    assert ours == theirs
    decoded = msgpack.unpackb(ours, object_hook=msgpack_numpy.decode, strict_map_key=False)["a"]
    assert same(decoded, unpack_sample(theirs)["a"])


@pytest.mark.parametrize("array", [a for a in ARRAYS if a.dtype.kind in "MmV"],
                         ids=lambda a: f"{a.dtype}{a.shape}")
def test_msgpack_numpy_reads_what_it_cannot_write(array):
    theirs = msgpack.unpackb(pack_sample(array), object_hook=msgpack_numpy.decode)
    assert theirs.dtype == array.dtype and theirs.tobytes() == array.tobytes()


@pytest.mark.parametrize("value, expected", [
    (np.int64(-5), np.int64(-5)),
    (np.uint8(200), np.uint8(200)),
    (np.bool_(True), np.bool_(True)),
    (np.float32(0.25), np.float32(0.25)),
    (np.float64(0.25), 0.25),  # a float subclass: msgpack packs it as a plain float
    (np.complex128(1 - 2j), np.complex128(1 - 2j)),
    (np.datetime64("2020-01-02"), np.datetime64("2020-01-02")),
    (1.5 + 2j, 1.5 + 2j),
])
def test_numpy_scalars_and_complex_round_trip(value, expected):
    decoded = unpack_sample(pack_sample([value]))[0]
    assert type(decoded) is type(expected) and decoded == expected
    if not isinstance(value, np.datetime64):  # msgpack-numpy cannot pack these
        assert pack_sample([value]) == msgpack.packb([value], default=msgpack_numpy.encode)


def test_samples_keep_msgpack_semantics():
    sample = {"key": "k", 1: "int key", "t": (1, (2, 3)), "b": b"\x00", "u": "ü",
              "big": 2**64 - 1, "neg": -2**63, "none": None, "nested": {"x": [1.5, True]}}
    assert unpack_sample(pack_sample(sample)) == {**sample, "t": [1, [2, 3]]}


@pytest.mark.parametrize("value", [{1, 2}, object(), np.array([object()]), 2**64])
def test_unpackable_values_raise_at_pack(value):
    with pytest.raises((TypeError, OverflowError)):
        pack_sample({"v": value})


def test_pickled_object_arrays_are_refused_when_read():
    theirs = msgpack.packb(np.array([1, "a"], dtype=object), default=msgpack_numpy.encode)
    with pytest.raises(FormatError, match="unpickle"):
        unpack_sample(theirs)


def test_maps_that_only_look_like_arrays_pass_through():
    assert decode_numpy({b"nd": True}) == {b"nd": True}
    assert decode_numpy({b"complex": True}) == {b"complex": True}
    assert decode_numpy({"nd": True, "type": "<i4"}) == {"nd": True, "type": "<i4"}


def test_encode_refuses_unknown_types_with_the_type_name():
    with pytest.raises(TypeError, match="set"):
        encode_numpy({1})


@pytest.mark.parametrize("data", [
    b"\x81\xa3key",                 # incomplete
    b"\x81\xa3key\xa1a\x00",        # a complete message and an extra byte
    b"\xc1",                        # never-used type byte
    b"\xdd\xff\xff\xff\xff",        # array of 2**32 - 1 elements in 5 bytes
    b"\xc6\xff\xff\xff\xff\x00",    # bin of 4 GiB
    b"",
])
def test_bad_messages_raise_format_error_naming_where(data):
    with pytest.raises(FormatError) as raised:
        unpack_sample(data, path="p.msgpack", index=4, offset=40)
    error = raised.value
    assert (error.path, error.index, error.offset) == ("p.msgpack", 4, 40)
    assert isinstance(error, ValueError)


def test_key_hashing_matches_datadings():
    assert key_salt(0) == bytes.fromhex("652e530edee5893b")
    for key in ["", "a", "00000001", "ünïcödé", "x" * 500]:
        assert hash_key(key, key_salt(3)) == hash_string(key, key_salt(3))
    keys = [f"{i:06d}" for i in range(1000)]
    salt, hashes = hash_keys(keys)
    theirs_salt, theirs = dd_index.hash_keys(keys)
    assert salt == theirs_salt and hashes.tolist() == [int(h) for h in theirs]


def test_hash_keys_tries_the_next_salt_on_a_collision(monkeypatch):
    real = hashing.salted_hashes

    def collide_on_first_salt(keys, salt):
        hashes = real(keys, salt)
        return np.zeros_like(hashes) if salt == key_salt(0) else hashes
    monkeypatch.setattr(hashing, "salted_hashes", collide_on_first_salt)
    salt, hashes = hash_keys(["a", "b"])
    assert salt == key_salt(1) and int(hashes[1]) == hash_key("b", key_salt(1))


def test_hash_keys_gives_up_on_duplicate_keys():
    with pytest.raises(RuntimeError, match="3 salts"):
        hash_keys(["a", "a"], max_tries=3)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 31, 1000, 5000])
def test_bloom_filter_is_byte_identical_to_simplebloom(n):
    keys = [f"key-{i}" for i in range(n)] + (["ünïcode", "x" * 300] if n > 10 else [])
    theirs = SimpleBloom(max(2, len(keys)))
    for key in keys:
        theirs += key
    ours = BloomFilter.build(keys)
    assert ours.dumps() == bytes(theirs.dumps())
    assert all(key in ours for key in keys)
    loaded = SimpleBloom.loads(ours.dumps())
    assert all(key in loaded for key in keys)


def test_bloom_filter_load_checks_and_membership_of_non_strings_and_unencodable_ones():
    bloom = BloomFilter.loads(BloomFilter.build(["a"]).dumps())
    assert "a" in bloom and 1 not in bloom and b"a" not in bloom
    assert "\ud800" not in bloom and "a\udcff" not in bloom  # UTF-8 cannot hold these keys
    with pytest.raises(ValueError, match="header"):
        BloomFilter.loads(b"SIMP")
    with pytest.raises(ValueError, match="simplebloom"):
        BloomFilter.loads(b"NOTBLOOM" + bytes(40))
    with pytest.raises(ValueError, match="num_elements"):
        BloomFilter(1)
    with pytest.raises(ValueError, match="false_positive_prob"):
        BloomFilter(10, 1.5)


def test_bloom_filter_false_positive_rate_is_about_one_over_n():
    bloom = BloomFilter.build([f"in-{i}" for i in range(2000)])
    false_positives = sum(f"out-{i}" in bloom for i in range(20000))
    assert false_positives < 60  # expected about 10


def test_dataset_files_are_named_after_the_data_file(tmp_path):
    files = DatasetFiles(tmp_path / "a.b.msgpack")
    assert files.legacy_index.name == "a.b.msgpack.index"
    assert [p.name for p in files.all_files] == [
        "a.b.msgpack", "a.b.msgpack.offsets", "a.b.msgpack.keys", "a.b.msgpack.key_hashes",
        "a.b.msgpack.filter", "a.b.msgpack.key_index", "a.b.msgpack.md5"]


def test_md5_files_in_text_and_binary_mode_are_read(tmp_path):
    (tmp_path / "x.msgpack.md5").write_text("aa  x.msgpack\nbb *x.msgpack.keys\n\n")
    assert read_md5(tmp_path / "x.msgpack") == {"x.msgpack": "aa", "x.msgpack.keys": "bb"}


def test_write_index_matches_datadings_index_files(tmp_path):
    keys, offsets = ["b", "a", "ü"], [0, 10, 25, 26]
    fmt.write_index(tmp_path / "ours.msgpack", keys, offsets, "0" * 32)
    dd_index.write_offsets(offsets, tmp_path / "theirs.msgpack")
    dd_index.write_keys(keys, tmp_path / "theirs.msgpack")
    dd_index.write_key_hashes(keys, tmp_path / "theirs.msgpack")
    dd_index.write_filter(keys, tmp_path / "theirs.msgpack")
    for suffix in (".offsets", ".keys", ".key_hashes", ".filter"):
        ours = (tmp_path / f"ours.msgpack{suffix}").read_bytes()
        assert ours == (tmp_path / f"theirs.msgpack{suffix}").read_bytes(), suffix
        md5 = read_md5(tmp_path / "ours.msgpack")[f"ours.msgpack{suffix}"]
        assert md5 == hashlib.md5(ours).hexdigest()
    assert fmt.read_keys(tmp_path / "ours.msgpack") == keys
    assert fmt.read_offsets(tmp_path / "ours.msgpack").tolist() == offsets


@pytest.mark.parametrize("suffix, content", [(".offsets", b"\x00" * 12), (".offsets", b""),
                                             (".key_hashes", b"\x00" * 4), (".keys", b"\xc1")])
def test_malformed_index_files_raise_format_error(tmp_path, suffix, content):
    (tmp_path / f"x.msgpack{suffix}").write_bytes(content)
    reader = {".offsets": fmt.read_offsets, ".key_hashes": fmt.read_key_hashes,
              ".keys": fmt.read_keys}[suffix]
    with pytest.raises(FormatError, match=suffix):
        reader(tmp_path / "x.msgpack")
