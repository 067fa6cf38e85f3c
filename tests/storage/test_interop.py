"""Byte compatibility with the real datadings package, in both directions."""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from datadings.reader import MsgpackReader as DatadingsReader
from datadings.writer import FileWriter as DatadingsFileWriter
from datadings.writer import RawWriter as DatadingsRawWriter

from fpipe.dataset import FileWriter, MsgpackReader, RawWriter, pack_sample
from fpipe.files import DatasetFiles

from .conftest import same


def _rich_samples(n: int = 40) -> list[dict]:
    rng = np.random.default_rng(1)
    dtypes = ["<f4", ">i2", "u1", "<c16", "?", "<U3", "<i8"]
    return [{
        "key": f"k{i}-ü",
        "image": rng.integers(0, 255, (i % 4, 3)).astype(dtypes[i % len(dtypes)]),
        "scalar": np.int16(i), "float32": np.float32(i / 3), "complex": complex(i, -i),
        "label": i % 5, "big": 2**64 - 1 - i, "neg": -2**63 + i,
        "tuple": (i, "x"), "bytes": rng.bytes(i), "nested": {1: [0.5, None, {"deep": b"\x00"}]},
    } for i in range(n)]


def _decoded(sample):
    """What the datadings decoder gives for a sample (tuples as lists)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in sample.items()}


@pytest.fixture
def both(tmp_path):
    samples = _rich_samples()
    with DatadingsFileWriter(tmp_path / "dd.msgpack", disable=True) as writer:
        for sample in samples:
            writer.write(sample)
    with FileWriter(tmp_path / "fp.msgpack") as writer:
        for sample in samples:
            writer.write(sample)
    return samples, str(tmp_path / "dd.msgpack"), str(tmp_path / "fp.msgpack")


def test_fpipe_writes_the_same_bytes_as_datadings(both):
    # datadings's files byte for byte; fpipe's key index besides, listed last in .md5
    _, theirs, ours = both
    for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), suffix
    lines = Path(ours + ".md5").read_text().splitlines()
    expected = Path(theirs + ".md5").read_text().replace("dd.msgpack", "fp.msgpack").splitlines()
    assert lines[:-1] == expected and lines[-1].endswith("  fp.msgpack.key_index")


def test_datadings_reads_what_fpipe_writes(both):
    samples, _, ours = both
    reader = DatadingsReader(ours)
    assert len(reader) == len(samples)
    for i, sample in enumerate(samples):
        assert same(reader.get(i), _decoded(sample))
        assert reader.find_index(sample["key"]) == i and sample["key"] in reader
        assert reader.find_key(i) == sample["key"]
    assert "missing" not in reader and reader.verify_data()
    assert all(same(a, _decoded(b)) for a, b in zip(reader, samples))


def test_fpipe_reads_what_datadings_writes(both):
    samples, theirs, _ = both
    reader, reference = MsgpackReader(theirs), DatadingsReader(theirs)
    assert len(reader) == len(samples) and reader.verify_data() and reader.verify_index()
    for i, sample in enumerate(samples):
        assert same(reader.get(i), reference.get(i)) and same(reader[i], _decoded(sample))
        assert reader.find_index(sample["key"]) == i and sample["key"] in reader
        assert reader.find_key(i) == sample["key"]
        assert reader.get(i, raw=True) == reference.get(i, raw=True)
    assert "missing" not in reader
    assert all(same(a, b) for a, b in zip(reader.iter(chunk_size=3), reference.iter(chunk_size=5)))


def test_verify_data_agrees_with_datadings_on_damaged_files(both):
    _, theirs, ours = both
    for path in (theirs, ours):
        size = os.path.getsize(path)
        with open(path, "ab") as file:
            file.write(b"\x00")
        assert not MsgpackReader(path).verify_data() and not DatadingsReader(path).verify_data()
        os.truncate(path, size - 1)
        assert not MsgpackReader(path).verify_data() and not DatadingsReader(path).verify_data()


def test_raw_writers_agree(tmp_path):
    packed = [("a", pack_sample({"key": "a", "v": 1})), ("b", b"\xc0"), ("c", pack_sample([1, 2]))]
    with DatadingsRawWriter(tmp_path / "dd.msgpack", disable=True) as writer:
        for key, data in packed:
            writer.write(key, data)
    with RawWriter(tmp_path / "fp.msgpack") as writer:
        for key, data in packed:
            writer.write(key, data)
    for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter"):
        ours, theirs = tmp_path / f"fp.msgpack{suffix}", tmp_path / f"dd.msgpack{suffix}"
        assert ours.read_bytes() == theirs.read_bytes(), suffix
    assert MsgpackReader(tmp_path / "dd.msgpack")[:] == [{"key": "a", "v": 1}, None, [1, 2]]


def test_datadings_reads_fpipe_datasets_with_missing_optional_files(both):
    _, _, ours = both
    os.remove(ours + ".key_hashes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = DatadingsReader(ours)
    assert reader.find_index("k7-ü") == MsgpackReader(ours).find_index("k7-ü") == 7


def test_empty_datasets_agree(tmp_path):
    with DatadingsFileWriter(tmp_path / "dd.msgpack", disable=True):
        pass
    FileWriter(tmp_path / "fp.msgpack").close()
    for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter"):
        ours, theirs = tmp_path / f"fp.msgpack{suffix}", tmp_path / f"dd.msgpack{suffix}"
        assert ours.read_bytes() == theirs.read_bytes(), suffix
    assert list(MsgpackReader(tmp_path / "dd.msgpack")) == []


# --- what ported code calls besides the public API ---------------------------------------------


def test_the_suffix_constants_are_datadings_s():
    import datadings.index

    import fpipe

    names = [name for name in vars(datadings.index) if name.startswith("SUFFIX_")]
    assert len(names) == 5
    assert {name: getattr(fpipe.files, name) for name in names} == \
        {name: getattr(datadings.index, name) for name in names}
    files = DatasetFiles("x.msgpack")
    assert [files.offsets.name, files.keys.name, files.legacy_index.name] == \
        ["x.msgpack" + fpipe.dataset.SUFFIX_OFFSETS, "x.msgpack" + fpipe.dataset.SUFFIX_KEYS,
         "x.msgpack" + fpipe.dataset.SUFFIX_LEGACY_INDEX]


def test_close_has_datadings_s_private_name_too(both):
    _, _, path = both
    reader = MsgpackReader(path)
    assert reader.get(0)["label"] == 0
    reader._close()
    assert reader._handle is None and reader.get(1)["label"] == 1  # reopened when needed


class _KeyedWriter(FileWriter):
    """A subclass in the manner of one written for datadings (torchfusion's): ``write`` takes
    the key apart from the sample and counts the bytes, through the documented hook."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bytes_written = 0

    def write(self, sample, key):
        packed = pack_sample(sample)
        self.write_packed(key, packed)
        self.bytes_written += len(packed)


def test_a_writer_subclass_that_chooses_the_key_uses_write_packed(tmp_path):
    samples = _rich_samples(5)
    with _KeyedWriter(tmp_path / "k.msgpack") as writer:
        for i, sample in enumerate(samples):
            writer.write({k: v for k, v in sample.items() if k != "key"}, f"id{i}")
        with pytest.raises(ValueError, match="duplicate key 'id0'"):
            writer.write(samples[0], "id0")
        with pytest.raises(ValueError, match="empty"):
            writer.write_packed("id9", b"")
    assert writer.bytes_written == (tmp_path / "k.msgpack").stat().st_size
    reader = DatadingsReader(tmp_path / "k.msgpack")
    assert [reader.find_key(i) for i in range(len(reader))] == [f"id{i}" for i in range(5)]
    assert MsgpackReader(tmp_path / "k.msgpack").verify_data()
