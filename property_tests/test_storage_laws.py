"""Laws of packed datasets: round trips, reading equivalences, truncation, compatibility."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

import msgpack
import msgpack_numpy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simplebloom import BloomFilter as SimpleBloom

from fpipe.dataset import (
    BloomFilter,
    FileWriter,
    MsgpackReader,
    RawWriter,
    pack_sample,
    rebuild_index,
    unpack_sample,
)
from fpipe.dataset.keyindex import _first_not_below
from fpipe.errors import FormatError
from property_tests.strategies import (
    any_text,
    as_decoded,
    dataset_samples,
    msgpack_numpy_dtypes,
    msgpack_values,
    numpy_arrays,
    same,
)

# Laws that write a dataset per example are costlier: fewer examples, whatever the profile.
WRITES = settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])



@contextmanager
def written(samples: list[dict]):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "law.msgpack")
        with FileWriter(path) as writer:
            for sample in samples:
                writer.write(sample)
        yield path


@given(msgpack_values())
def test_codec_round_trip(value):
    assert same(unpack_sample(pack_sample(value)), as_decoded(value))


@given(msgpack_values(numpy_arrays(msgpack_numpy_dtypes)))
def test_packing_is_byte_identical_to_msgpack_numpy(value):
    theirs = msgpack.packb(value, default=msgpack_numpy.encode, use_bin_type=True)
    assert pack_sample(value) == theirs
    assert same(unpack_sample(theirs), msgpack.unpackb(
        theirs, object_hook=msgpack_numpy.decode, strict_map_key=False))


@WRITES
@given(dataset_samples())
def test_written_samples_read_back_equal(samples):
    with written(samples) as path:
        reader = MsgpackReader(path)
        expected = [as_decoded(sample) for sample in samples]
        assert len(reader) == len(samples) and same(list(reader), expected)
        for i, sample in enumerate(samples):
            assert same(reader.get(i), expected[i])
            assert reader.find_key(i) == sample["key"] and reader.find_index(sample["key"]) == i
            assert sample["key"] in reader
        assert reader.verify_data() and reader.verify_index()


@WRITES
@given(dataset_samples(max_size=10), st.data())
def test_membership_agrees_with_the_written_keys_for_any_str(samples, data):
    keys = [sample["key"] for sample in samples]
    near = st.sampled_from(keys).map(lambda key: key + "\ud800") if keys else st.nothing()
    probes = data.draw(st.lists(any_text | near, max_size=8)) + keys
    with written(samples) as path:
        reader = MsgpackReader(path)
        for probe in probes:
            assert (probe in reader) == (probe in keys)
            if probe in keys:
                assert reader.find_index(probe) == keys.index(probe)
            else:
                with pytest.raises(KeyError):
                    reader.find_index(probe)


@WRITES
@given(dataset_samples(max_size=30), st.lists(st.integers(1, 40), min_size=1, max_size=4))
def test_iteration_is_the_same_for_every_chunk_size(samples, chunk_sizes):
    with written(samples) as path:
        reader = MsgpackReader(path)
        whole = list(reader.iter(raw=True))
        assert whole == [reader.get(i, raw=True) for i in range(len(reader))]
        for chunk_size in chunk_sizes:
            assert list(reader.iter(raw=True, chunk_size=chunk_size)) == whole
            assert same(list(reader.iter(chunk_size=chunk_size)), list(reader))


@WRITES
@given(dataset_samples(max_size=20), st.data())
def test_slices_and_get_many_equal_indexing(samples, data):
    with written(samples) as path:
        reader, n = MsgpackReader(path), len(samples)
        start, stop = (data.draw(st.none() | st.integers(-n - 3, n + 3)) for _ in range(2))
        step = data.draw(st.none() | st.integers(-4, 4).filter(bool))
        expected = [reader[i] for i in range(n)[start:stop:step]]
        assert same(reader[start:stop:step], expected)
        assert same(list(reader.iter(start, stop)), [reader[i] for i in range(n)[start:stop]])
        if n:
            indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=10))
            assert same(reader.get_many(indices), [reader[i] for i in indices])


@WRITES
@given(dataset_samples(max_size=10), st.data())
def test_truncation_gives_format_error_or_the_right_record_never_a_wrong_one(samples, data):
    packed = [pack_sample(sample) for sample in samples]
    ends = np.cumsum([0] + [len(p) for p in packed]).tolist()
    cut = data.draw(st.integers(0, ends[-1]))
    with written(samples) as path:
        os.truncate(path, cut)
        reader = MsgpackReader(path)
        for i, sample in enumerate(samples):
            if ends[i + 1] <= cut:
                assert same(reader.get(i), as_decoded(sample))
            else:
                try:
                    reader.get(i)
                except FormatError as error:
                    assert (error.index, error.offset) == (i, ends[i])
                else:
                    raise AssertionError(f"sample {i} read although cut at byte {cut}")
        complete = sum(end <= cut for end in ends[1:])
        report = rebuild_index(path)
        assert report.samples == complete and report.incomplete_bytes == cut - ends[complete]
        assert same(list(MsgpackReader(path)), [as_decoded(s) for s in samples[:complete]])


@WRITES
@given(st.lists(st.tuples(st.text(max_size=6), msgpack_values()), unique_by=lambda kv: kv[0],
                max_size=10))
def test_raw_writes_read_back_as_the_same_bytes(items):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "raw.msgpack")
        with RawWriter(path) as writer:
            for key, value in items:
                writer.write(key, pack_sample(value))
        reader = MsgpackReader(path)
        assert list(reader.rawiter(yield_key=True)) == [(k, pack_sample(v)) for k, v in items]


@given(st.lists(st.text(max_size=10), unique=True, max_size=60))
def test_bloom_filter_holds_its_keys_and_matches_simplebloom(keys):
    ours = BloomFilter.build(keys)
    theirs = SimpleBloom(max(2, len(keys)))
    for key in keys:
        theirs += key
    assert ours.dumps() == bytes(theirs.dumps()) and all(key in ours for key in keys)


@WRITES
@given(dataset_samples(max_size=12), st.lists(st.integers(0, 12), max_size=3))
def test_appending_in_parts_writes_the_files_of_one_write(samples, cuts):
    bounds = [0, *sorted(min(cut, len(samples)) for cut in cuts), len(samples)]
    with written(samples) as whole, tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "law.msgpack")
        for low, high in zip(bounds, bounds[1:]):
            with FileWriter(path, append=True) as writer:
                for sample in samples[low:high]:
                    writer.write(sample)
        for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter", ".md5"):
            with open(whole + suffix, "rb") as a, open(path + suffix, "rb") as b:
                assert a.read() == b.read(), suffix


@given(msgpack_values(numpy_arrays(msgpack_numpy_dtypes)))
def test_copies_decode_equal_and_writable(value):
    packed = pack_sample(value)
    copied, viewed = unpack_sample(packed, copy=True), unpack_sample(packed)
    assert same(copied, viewed)
    assert all(array.flags.writeable for array in _arrays(copied))
    assert not any(array.flags.writeable for array in _arrays(viewed))


def _arrays(value):
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _arrays(item)
    elif isinstance(value, list):
        for item in value:
            yield from _arrays(item)


@given(st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=300).map(sorted),
       st.integers(0, 2**64 - 1))
def test_a_key_index_bucket_is_searched_as_numpy_searches_its_hashes(hashes, wanted):
    bucket = b"".join(value.to_bytes(8, "big") + index.to_bytes(8, "big")
                      for index, value in enumerate(hashes))
    for target in (wanted, *hashes[:3], *hashes[-2:]):
        at = _first_not_below(bucket, target.to_bytes(8, "big"))
        assert at == 16 * int(np.searchsorted(np.array(hashes, dtype=np.uint64), np.uint64(target)))
