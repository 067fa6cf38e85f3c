"""Laws of the other formats: codec and export round trips, and damage that never yields a
wrong sample (WebDataset shards, Parquet files, TFRecord files)."""

from __future__ import annotations

import os
import tempfile

import crc32c as crc32c_package
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpipe.dataset import pack_sample
from fpipe.errors import FormatError
from fpipe.formats import (
    ParquetReader,
    TarReader,
    TFRecordFileReader,
    TFRecordWriter,
    WebDatasetReader,
    encode_example,
    member_key,
    parse_example,
    write_parquet,
    write_webdataset,
)
from fpipe.formats._crc32c import numpy_crc32c, python_crc32c
from fpipe.remote import RemoteOptions
from property_tests.strategies import same

# Laws that write files per example are costlier: fewer examples, whatever the profile.
WRITES = settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], deadline=None)

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
int64s = st.lists(st.integers(-2**63, 2**63 - 1), max_size=6).map(lambda v: np.array(v, np.int64))
float32s = st.lists(st.floats(width=32), max_size=6).map(lambda v: np.array(v, np.float32))
byte_lists = st.lists(st.binary(max_size=20), min_size=2, max_size=4)  # [] reads back as floats
features = st.dictionaries(names, st.one_of(st.binary(max_size=40), byte_lists, int64s, float32s),
                           max_size=5)



@given(features)
def test_an_example_decodes_to_what_was_encoded(values):
    assert same(parse_example(encode_example(values)), values)


@given(st.binary(max_size=3000))
def test_every_crc32c_gives_the_same_checksum(data):
    assert numpy_crc32c(data) == python_crc32c(data) == crc32c_package.crc32c(data)


@WRITES
@given(st.lists(features, max_size=12), st.integers(1, 5))
def test_tfrecord_files_read_back_what_was_written(records, chunk_size):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "x.tfrecord")
        with TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=folder))
        assert len(reader) == len(records)
        assert all(same(a, b) for a, b in zip(reader.iter(chunk_size=chunk_size), records))
        assert all(same(reader[i], records[i]) for i in range(len(records)))


@WRITES
@given(st.lists(st.dictionaries(names, st.integers(0, 2**40), min_size=1, max_size=3),
                min_size=1, max_size=8), st.data())
def test_a_damaged_tfrecord_file_never_yields_a_wrong_record(records, data):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "x.tfrecord")
        with TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        damaged = bytearray(open(path, "rb").read())
        if data.draw(st.booleans(), "cut"):
            damaged = damaged[:data.draw(st.integers(0, len(damaged) - 1), "at")]
        else:
            at = data.draw(st.integers(0, len(damaged) - 1), "at")
            damaged[at] ^= data.draw(st.integers(1, 255), "flip")
        open(path, "wb").write(bytes(damaged))
        reader = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=folder))
        for i in range(len(reader)):
            try:
                sample = reader[i]
            except FormatError as error:
                assert error.index == i and error.path == path
                continue
            assert i < len(records) and same(sample, {k: np.array([v]) for k, v in records[i].items()})


_field_values = st.one_of(
    st.tuples(st.just("bin"), st.binary(max_size=30)),
    st.tuples(st.just("label.cls"), st.integers(-10**12, 10**12)),
    st.tuples(st.just("caption.txt"), st.text(max_size=20)),
    st.tuples(st.just("meta.json"), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)),
)
_keys = st.lists(st.from_regex(r"[a-z0-9/]{0,6}[a-z0-9]", fullmatch=True), min_size=1,
                 max_size=12, unique_by=member_key)


@WRITES
@given(_keys, st.lists(st.lists(_field_values, min_size=1, max_size=3), min_size=12, max_size=12),
       st.integers(1, 5))
def test_webdataset_export_reads_back_exactly(keys, fields, shard_size):
    samples = [{"key": key, **dict(chosen)} for key, chosen in zip(keys, fields)]
    with tempfile.TemporaryDirectory() as folder:
        names = write_webdataset(samples, os.path.join(folder, "s-%04d.tar"), shard_size=shard_size)
        assert len(names) == -(-len(samples) // shard_size)
        back = list(WebDatasetReader(names, decode=True, remote=RemoteOptions(cache_dir=folder)))
        assert back == [{**sample, "key": member_key(sample["key"])} for sample in samples]


_columns = st.sampled_from([
    ("flag", st.booleans()), ("n", st.integers(-2**63, 2**63 - 1)),
    ("x", st.floats(allow_nan=False)), ("text", st.text(max_size=10)),
    ("blob", st.binary(max_size=10)), ("ids", st.lists(st.integers(-100, 100), max_size=4)),
])


@WRITES
@given(st.lists(_columns, min_size=1, max_size=4, unique_by=lambda c: c[0]), st.data(),
       st.integers(1, 6), st.integers(1, 4))
def test_parquet_export_reads_back_exactly(columns, data, shard_size, row_group_size):
    n = data.draw(st.integers(1, 12), "n")
    samples = [{"key": f"k{i}", **{name: data.draw(values, name) for name, values in columns}}
               for i in range(n)]
    shape = data.draw(st.sampled_from([(1,), (2,), (2, 3)]), "shape")  # 0-d arrays: an error
    for i, sample in enumerate(samples):
        sample["array"] = np.full(shape, i, np.float32)
    with tempfile.TemporaryDirectory() as folder:
        names = write_parquet(samples, os.path.join(folder, "p-%03d.parquet"),
                              shard_size=shard_size, row_group_size=row_group_size)
        reader = ParquetReader(names)
        assert all(same(a, b) for a, b in zip(reader, samples)) and len(reader) == n
        assert reader.find_index(f"k{n - 1}") == n - 1


@WRITES
@given(st.lists(st.binary(max_size=700), min_size=1, max_size=6), st.data())
def test_a_cut_shard_never_yields_a_wrong_sample(payloads, data):
    samples = [{"key": f"{i:03d}", "bin": payload, "txt": payload[:3]} for i, payload in enumerate(payloads)]
    with tempfile.TemporaryDirectory() as folder:
        (path,) = write_webdataset(samples, os.path.join(folder, "s-%d.tar"))
        whole = open(path, "rb").read()
        cut = data.draw(st.integers(0, len(whole)), "cut")
        open(path, "wb").write(whole[:cut])
        try:
            reader = TarReader(path, remote=RemoteOptions(cache_dir=folder))
        except FormatError as error:  # when no member is whole: the first one's header and data
            assert error.path == path and cut < 512 + len(payloads[0])
            return
        for i in range(len(reader)):
            try:
                sample = reader[i]
            except FormatError as error:
                assert error.index == i
                continue
            assert sample == samples[i]


# --- the Example parser: the path for the layout writers use against the general one -----------
# Examples are drawn at the wire level: the layout every writer uses (lengths of one, two and
# three bytes, packed numbers) and what else protobuf allows or damage makes (numbers not
# packed, several lists in a feature, entries with the feature first or without a name,
# unknown fields, varints past 64 bits, names that are not UTF-8), then perhaps damaged.

def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


_wire_ints = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))
_long_varints = st.integers(2**64, 2**70 - 1)  # protobuf keeps the low 64 bits
_byte_values = st.one_of(st.binary(max_size=8), st.binary(min_size=120, max_size=300),
                         st.binary(min_size=16380, max_size=16390))


def _packed_list(values: list[int]) -> bytes:
    return _field(1, b"".join(map(_varint_bytes, values)))


# the lists of the layout writers use, as (Feature field number, list message)
_common_lists = st.one_of(
    st.tuples(st.just(1), st.lists(_byte_values, max_size=3).map(
        lambda v: b"".join(_field(1, x) for x in v))),
    st.tuples(st.just(2), st.binary(max_size=6).map(lambda v: _field(1, v * 4))),
    st.tuples(st.just(3), st.lists(_wire_ints, max_size=4).map(_packed_list)))
# and others that protobuf allows or damage makes
_other_lists = st.one_of(
    st.tuples(st.just(2), st.binary(max_size=9).map(lambda v: _field(1, v))),
    st.tuples(st.just(2), st.binary(min_size=4, max_size=4).map(lambda v: b"\x0d" + v * 2)),
    st.tuples(st.just(3), st.lists(st.one_of(_wire_ints, _long_varints), max_size=3).map(
        lambda v: b"".join(b"\x08" + _varint_bytes(x) for x in v) + _packed_list(v))),
    st.tuples(st.just(3), st.lists(_long_varints, min_size=1, max_size=2).map(_packed_list)),
    st.tuples(st.sampled_from([1, 2, 3]), st.just(b"")),
    st.tuples(st.just(1), _byte_values.map(lambda v: _field(1, v) + b"\x10\x01")))
_unknown = st.sampled_from([
    b"", b"\x20\x07", b"\x3a\x01x", b"\x45\x00\x00\x00\x00",
    b"\x23\x28\x01\x2b\x2c\x24",  # groups, which protobuf skips
    b"\x23\x2c", b"\x24", b"\x00\x01", b"\x26\x00", b"\x27",  # which it refuses
    b"\xb8\x80\x80\x80\x00\x01", b"\x3a\x80\x80\x80\x80\x00",  # long tags and lengths
    b"\xb8\x80\x80\x80\x80\x00\x01", b"\x3a\x80\x80\x80\x80\x80\x00"])  # too long
_odd_names = st.sampled_from([b"", b"\xff", b"a" * 127, b"a" * 128])  # 128: a length of 2 bytes


_common_entries = st.tuples(names.map(str.encode), _common_lists).map(
    lambda v: _field(1, v[0]) + _field(2, _field(*v[1])))


def _example(entries: list[bytes]) -> bytes:
    return _field(1, b"".join(_field(1, entry) for entry in entries))


@st.composite
def _map_entries(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 4)) < 4:  # as writers lay it out
        return draw(_common_entries)
    name = _field(1, draw(names).encode() if draw(st.integers(0, 1)) else draw(_odd_names))
    lists = draw(st.lists(st.one_of(_common_lists, _other_lists), max_size=2))
    feature = _field(2, b"".join(_field(*item) for item in lists))
    parts = draw(st.sampled_from([(name, feature), (feature, name), (feature,), (name,)]))
    return b"".join(parts) + draw(_unknown)


@st.composite
def wire_examples(draw: st.DrawFn) -> bytes:
    example = _example(draw(st.lists(_map_entries(), max_size=4)))
    if draw(st.integers(0, 4)) < 4:
        return example
    return example * draw(st.integers(1, 2)) + draw(_unknown)  # merged Example.features


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    if not data or draw(st.integers(0, 2)):
        return data
    at = draw(st.integers(0, len(data) - 1))
    return draw(st.sampled_from([data[:at], data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))])
                                 + data[at + 1:], data[:at] + draw(st.binary(min_size=1, max_size=2))
                                 + data[at:]]))


def _outcome(parse, data: bytes):
    try:
        return "value", parse(data)
    except (ValueError, UnicodeDecodeError) as error:
        return "error", f"{type(error).__name__}: {error}"


@given(wire_examples().flatmap(damaged))
def test_parse_example_answers_as_the_general_parser_on_any_bytes(data):
    from fpipe.formats.tfrecord import _any_example

    ours, general = _outcome(parse_example, data), _outcome(_any_example, data)
    assert ours[0] == general[0] and same(ours[1], general[1])
    if ours[0] == "value":
        assert list(ours[1]) == list(general[1])  # the same order of features


@given(st.lists(_common_entries, max_size=4).map(_example))
def test_the_layout_writers_use_takes_the_common_path(data):
    from fpipe.formats.tfrecord import _COMMON_NUMBERS, _any_example, _common_example

    assert same(_common_example(data, _COMMON_NUMBERS), _any_example(data))


@given(features)
def test_fpipes_own_examples_take_the_common_path(values):
    from fpipe.formats.tfrecord import _COMMON_NUMBERS, _common_example

    assert same(_common_example(encode_example(values), _COMMON_NUMBERS), values)


@given(wire_examples().flatmap(damaged))
def test_a_packable_example_packs_to_the_bytes_of_the_parsed_one(data):
    from fpipe.formats.tfrecord import packable_example

    ours, parsed = _outcome(packable_example, data), _outcome(parse_example, data)
    assert ours[0] == parsed[0]
    if ours[0] == "value":
        assert pack_sample(ours[1]) == pack_sample(parsed[1])
    else:
        assert ours == parsed


@given(st.lists(_common_entries, max_size=4).map(_example))
def test_the_layout_writers_use_is_made_packable_with_no_array(data):
    from fpipe.formats.tfrecord import packable_example

    values = packable_example(data).values()
    assert not any(isinstance(value, np.ndarray) for value in values)


# --- against protobuf ---------------------------------------------------------------------------
# Examples that protobuf serializes, and their pieces concatenated as protobuf merges them: an
# Example twice, an entry of a name twice, a feature twice in an entry, lists in a feature.

def _protobuf_features(data: bytes):
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
        values = list(getattr(feature, kind).value) if kind else []
        features[name] = _AS_FPIPE_GIVES[kind](values)
    return features


_AS_FPIPE_GIVES = {None: lambda values: None,
                   "float_list": lambda values: np.array(values, np.float32),
                   "int64_list": lambda values: np.array(values, np.int64),
                   "bytes_list": lambda values: values[0] if len(values) == 1 else values}


def _fpipe_features(data: bytes):
    try:
        return parse_example(data)
    except ValueError:
        return "error"


def _agree(ours, theirs) -> bool:
    """The same features; floats by value (protobuf's Python floats quiet a signalling NaN)."""
    if isinstance(ours, np.ndarray) and ours.dtype == np.float32:
        return (isinstance(theirs, np.ndarray) and theirs.dtype == np.float32
                and np.array_equal(ours, theirs, equal_nan=True))
    if isinstance(ours, dict):
        return isinstance(theirs, dict) and ours.keys() == theirs.keys() and all(
            _agree(ours[name], theirs[name]) for name in ours)
    return same(ours, theirs)


_protobuf_lists = st.one_of(
    st.tuples(st.just("bytes_list"), st.lists(st.binary(max_size=10), max_size=3)),
    st.tuples(st.just("float_list"), st.lists(st.floats(width=32), max_size=3)),
    st.tuples(st.just("int64_list"), st.lists(st.integers(-2**63, 2**63 - 1), max_size=3)),
    st.tuples(st.none(), st.just([])))


def _protobuf_feature(kind_values: tuple) -> bytes:
    from tfrecord import example_pb2

    kind, values = kind_values
    feature = example_pb2.Feature()
    if kind is not None:
        getattr(feature, kind).SetInParent()
        getattr(feature, kind).value.extend(values)
    return feature.SerializeToString()


_entry_names = st.one_of(st.sampled_from(["a", "b"]), names)


@st.composite
def _protobuf_entries(draw: st.DrawFn) -> bytes:
    """Serialized Features of one entry, by protobuf, or with its feature in several pieces."""
    from tfrecord import example_pb2

    name = draw(_entry_names)
    pieces = draw(st.lists(_protobuf_lists.map(_protobuf_feature), min_size=1, max_size=3))
    if len(pieces) == 1 and draw(st.booleans()):
        features = example_pb2.Features()
        features.feature[name].MergeFromString(pieces[0])
        return features.SerializeToString()
    entry = _field(1, name.encode()) + b"".join(_field(2, piece) for piece in pieces)
    return _field(1, entry)


protobuf_examples = st.lists(st.lists(_protobuf_entries(), max_size=3).map(
    lambda entries: _field(1, b"".join(entries))), min_size=1, max_size=3).map(b"".join)


@given(protobuf_examples)
def test_examples_and_their_merges_parse_as_protobuf_parses_them(data):
    ours = parse_example(data)
    assert _agree(ours, _protobuf_features(data))


@given(st.one_of(protobuf_examples, wire_examples()).flatmap(damaged))
def test_any_bytes_parse_as_protobuf_parses_them_or_are_refused_as_it_refuses_them(data):
    assert _agree(_fpipe_features(data), _protobuf_features(data))
