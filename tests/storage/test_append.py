"""FileWriter(append=True): the appended dataset equals one written in one go; the index,
filter and md5 are replaced whole; duplicate keys are refused; a failed append leaves the
original dataset as it was."""

from __future__ import annotations

import subprocess

import pytest

import fpipe.dataset.writer as writer_module
from fpipe.dataset import FileWriter, MsgpackReader, RawWriter, pack_sample
from fpipe.errors import FormatError
from fpipe.files import DatasetFiles


def _write(path, keys, **options):
    with FileWriter(path, **options) as writer:
        for key in keys:
            writer.write({"key": key, "value": key * 3})
    return path


def _snapshot(path):
    return {file.name: file.read_bytes() for file in DatasetFiles(path).all_files}


@pytest.mark.parametrize("buffering", [0, 1 << 16])
def test_appending_gives_the_files_of_one_write(tmp_path, buffering):
    whole = _write(tmp_path / "whole" / "x.msgpack", list("abcdefg"))
    appended = _write(tmp_path / "parts" / "x.msgpack", list("abc"))
    _write(appended, list("de"), append=True, buffering=buffering)
    with RawWriter(appended, append=True) as writer:
        for key in "fg":
            writer.write(key, pack_sample({"key": key, "value": key * 3}))
        assert writer.written == 2
    assert _snapshot(appended) == _snapshot(whole)
    md5 = subprocess.run(["md5sum", "-c", "x.msgpack.md5"], cwd=appended.parent,
                         capture_output=True, text=True)
    assert md5.returncode == 0, md5.stdout
    reader = MsgpackReader(appended)
    assert "f" in reader and reader.find_index("g") == 6 and reader.verify_data() and reader.verify_index()
    assert not list(appended.parent.glob(".fpipe-*"))


def test_append_creates_a_missing_dataset_and_extends_an_empty_one(tmp_path):
    path = _write(tmp_path / "x.msgpack", [], append=True)
    assert len(MsgpackReader(path)) == 0
    _write(path, ["a"], append=True)
    assert [s["key"] for s in MsgpackReader(path)] == ["a"]


def test_a_key_the_dataset_has_is_refused_and_the_rest_is_kept(tmp_path):
    path = _write(tmp_path / "x.msgpack", ["a", "b"])
    with pytest.raises(ValueError, match="duplicate key 'b'"):
        with FileWriter(path, append=True) as writer:
            writer.write({"key": "c"})
            writer.write({"key": "b"})
    assert [s["key"] for s in MsgpackReader(path)] == ["a", "b", "c"]
    assert MsgpackReader(path).verify_data()


def test_a_failed_write_leaves_the_original_dataset_intact(tmp_path, monkeypatch):
    path = _write(tmp_path / "x.msgpack", ["a", "b"])
    before = _snapshot(path)
    real = writer_module._write_all
    calls = []

    def fails_second(fd, block):
        calls.append(len(block))
        if len(calls) == 2:
            real(fd, block[:5])  # half a block reaches the disk, then it is full
            raise OSError(28, "No space left on device")
        real(fd, block)
    monkeypatch.setattr(writer_module, "_write_all", fails_second)
    writer = FileWriter(path, buffering=0, append=True)
    writer.write({"key": "c", "pad": "x" * 50})
    with pytest.raises(OSError, match="append stopped and was undone: the dataset holds its 2"):
        writer.write({"key": "d", "pad": "x" * 50})
    with pytest.raises(OSError, match="undone"):
        writer.close()
    assert _snapshot(path) == before


def test_a_failure_while_replacing_the_index_leaves_the_original_intact(tmp_path, monkeypatch):
    path = _write(tmp_path / "x.msgpack", ["a", "b"])
    before = _snapshot(path)

    def full_disk(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(writer_module.IndexBuilder, "finish", full_disk)
    with pytest.raises(OSError, match="No space"):
        _write(path, ["c"], append=True)
    assert _snapshot(path) == before and not list(path.parent.glob(".fpipe-*"))


def test_append_refuses_a_dataset_whose_files_disagree(tmp_path):
    path = _write(tmp_path / "x.msgpack", ["a", "b"])
    with open(path, "ab") as file:
        file.write(b"\x00")  # a tail the index does not know (a killed append, say)
    with pytest.raises(FormatError, match="does not describe the data file"):
        FileWriter(path, append=True)
    path = _write(tmp_path / "y.msgpack", ["a", "b"])
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="does not match its .md5"):
        FileWriter(path, append=True)
    DatasetFiles(path).offsets.unlink()
    with pytest.raises(FormatError, match="no .offsets and .keys"):
        FileWriter(path, append=True)
    with pytest.raises(ValueError, match="append=True or overwrite=True, not both"):
        FileWriter(tmp_path / "z.msgpack", overwrite=True, append=True)


def test_abandon_drops_what_the_writer_wrote(tmp_path):
    fresh = FileWriter(tmp_path / "new.msgpack", buffering=0)
    fresh.write({"key": "a"})
    fresh.abandon()
    fresh.close()
    assert list(tmp_path.iterdir()) == []
    path = _write(tmp_path / "x.msgpack", ["a"])
    before = _snapshot(path)
    with FileWriter(path, append=True, buffering=1 << 16) as writer:
        writer.write({"key": "b"})
        writer.abandon()
    assert _snapshot(path) == before
