"""Laws of the other formats: codec and export round trips, and damage that never yields a
wrong sample (WebDataset shards, Parquet files, TFRecord files)."""

from __future__ import annotations

import os
import tempfile

import crc32c as crc32c_package
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpipe.errors import FormatError
from fpipe.storage import (
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
from fpipe.storage._crc32c import numpy_crc32c, python_crc32c
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
        reader = TFRecordFileReader(path, cache_dir=folder)
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
        reader = TFRecordFileReader(path, cache_dir=folder)
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
        back = list(WebDatasetReader(names, decode=True, cache_dir=folder))
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
        open(path, "wb").write(whole[:data.draw(st.integers(0, len(whole)), "cut")])
        reader = TarReader(path, cache_dir=folder)
        for i in range(len(reader)):
            try:
                sample = reader[i]
            except FormatError as error:
                assert error.index == i
                continue
            assert sample == samples[i]
