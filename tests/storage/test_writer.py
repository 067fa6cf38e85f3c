"""Writers: files written, guards, buffering, progress, close-on-error, rebuild_index."""

import gc
import itertools
import os
import shutil
import subprocess
import sys
import threading

import msgpack
import pytest

from fpipe.errors import FormatError
from fpipe.storage import (
    DatasetFiles,
    FileWriter,
    MsgpackReader,
    RawWriter,
    pack_sample,
    read_md5,
    rebuild_index,
)
from fpipe.storage import writer as writer_module

from .conftest import make_samples, write


def test_writes_six_files_and_md5sum_accepts_them(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in DatasetFiles(path).all_files)
    data = (tmp_path / "set.msgpack").read_bytes()
    assert data == b"".join(map(pack_sample, samples))
    if shutil.which("md5sum"):
        subprocess.run(["md5sum", "--quiet", "-c", "set.msgpack.md5"], cwd=tmp_path, check=True)
    assert MsgpackReader(path).verify_data() and MsgpackReader(path).verify_index()


def test_parent_directories_are_created(tmp_path):
    path = write(tmp_path / "a" / "b" / "set.msgpack", make_samples(2))
    assert len(MsgpackReader(path)) == 2


@pytest.mark.parametrize("existing", ["set.msgpack", "set.msgpack.offsets", "set.msgpack.md5",
                                      "set.msgpack.index"])
def test_an_existing_dataset_is_never_overwritten_without_overwrite(tmp_path, existing):
    (tmp_path / existing).write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite=True") as raised:
        FileWriter(tmp_path / "set.msgpack")
    assert raised.value.filename == str(tmp_path / existing)
    assert (tmp_path / existing).read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == [existing]


def test_overwrite_replaces_the_dataset_and_removes_stale_index_files(tmp_path):
    path = write(tmp_path / "set.msgpack", make_samples(5))
    (tmp_path / "set.msgpack.index").write_bytes(b"stale legacy index")
    with FileWriter(path, overwrite=True) as writer:
        assert not (tmp_path / "set.msgpack.offsets").exists()
        assert not (tmp_path / "set.msgpack.index").exists()
        writer.write({"key": "only"})
    assert MsgpackReader(path)[:] == [{"key": "only"}]


def test_overwriting_does_not_disturb_a_reader_of_the_old_dataset(tmp_path):
    old = make_samples(20, size=5000)
    path = write(tmp_path / "set.msgpack", old)
    reader = MsgpackReader(path)
    assert reader[0] == old[0]
    write(path, make_samples(2, size=10, seed=1), overwrite=True)
    assert reader[19] == old[19] and reader[:] == old
    assert len(MsgpackReader(path)) == 2


def test_duplicate_key_raises_at_that_write_and_keeps_the_rest(tmp_path):
    path = tmp_path / "set.msgpack"
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        with FileWriter(path) as writer:
            writer.write({"key": "a", "n": 1})
            writer.write({"key": "b", "n": 2})
            writer.write({"key": "a", "n": 3})
    reader = MsgpackReader(path)
    assert reader[:] == [{"key": "a", "n": 1}, {"key": "b", "n": 2}] and reader.verify_data()


@pytest.mark.parametrize("key", [1, b"a", None, ("a",)])
def test_non_str_keys_raise_type_error_at_that_write(tmp_path, key):
    path = tmp_path / "set.msgpack"
    with FileWriter(path) as writer:
        writer.write({"key": "ok"})
        with pytest.raises(TypeError, match="keys must be str"):
            writer.write({"key": key})
        with pytest.raises(TypeError, match="keys must be str"):
            writer.write({"key": key, "x": 1})
        writer.write({"key": "also ok"})
    assert [s["key"] for s in MsgpackReader(path)] == ["ok", "also ok"]


@pytest.mark.parametrize("writer_class", [FileWriter, RawWriter])
def test_a_key_utf8_cannot_encode_raises_at_that_write_and_keeps_the_rest(tmp_path, writer_class):
    path = tmp_path / "set.msgpack"
    with writer_class(path) as writer:
        write = writer.write if writer_class is FileWriter else (
            lambda sample: writer.write(sample["key"], pack_sample(sample)))
        write({"key": "ok"})
        with pytest.raises(ValueError):  # a lone surrogate: the index could not hold it
            write({"key": "bad\ud800"})
        write({"key": "also ok"})
    reader = MsgpackReader(path)
    assert [s["key"] for s in reader] == ["ok", "also ok"] and reader.verify_index()


def test_samples_without_key_or_not_dicts_raise_key_error(tmp_path):
    with FileWriter(tmp_path / "set.msgpack") as writer:
        for bad in ({"label": 1}, ["key"], None):
            with pytest.raises(KeyError, match='"key"'):
                writer.write(bad)
        with pytest.raises(TypeError):
            writer.write({"key": "x", "bad": {1, 2}})
        writer.write({"key": "x"})
    assert MsgpackReader(tmp_path / "set.msgpack")[:] == [{"key": "x"}]


def test_index_and_md5_are_completed_when_the_block_raises(tmp_path):
    path = tmp_path / "set.msgpack"
    samples = make_samples(3000, size=1000)
    with pytest.raises(RuntimeError, match="boom"):
        with FileWriter(path, buffering=1 << 16) as writer:
            for sample in samples:
                writer.write(sample)
            raise RuntimeError("boom")
    reader = MsgpackReader(path)
    assert len(reader) == 3000 and reader[2999] == samples[2999] and reader.verify_data()


@pytest.mark.parametrize("buffering", [0, 1, 100, 1 << 16, 1 << 22])
def test_every_buffering_writes_the_same_bytes(tmp_path, buffering):
    samples = make_samples(300, size=500)
    path = write(tmp_path / "set.msgpack", samples, buffering=buffering)
    assert (tmp_path / "set.msgpack").read_bytes() == b"".join(map(pack_sample, samples))
    assert MsgpackReader(path)[:] == samples


@pytest.mark.parametrize(("buffering", "error"), [(-1, ValueError), (1.5, TypeError),
                                                  (True, TypeError), ("1", TypeError)])
def test_bad_buffering_is_rejected_at_construction(tmp_path, buffering, error):
    with pytest.raises(error, match="buffering"):
        FileWriter(tmp_path / "set.msgpack", buffering=buffering)
    assert not (tmp_path / "set.msgpack").exists()


def test_written_close_twice_and_write_after_close(tmp_path):
    writer = FileWriter(tmp_path / "set.msgpack")
    writer.write({"key": "a"})
    assert writer.written == 1 and "open" in repr(writer)
    writer.close()
    writer.close()
    assert "closed" in repr(writer)
    with pytest.raises(ValueError, match="closed writer"):
        writer.write({"key": "b"})


def test_raw_writer_writes_bytes_as_given_and_copies_buffers(tmp_path):
    buffer = bytearray(pack_sample({"key": "a", "v": 1}))
    with RawWriter(tmp_path / "set.msgpack") as writer:
        writer.write("a", memoryview(buffer))
        buffer[:] = pack_sample({"key": "b", "v": 2})
        writer.write("b", buffer)
        writer.write("nil", msgpack.packb(None))
        with pytest.raises(ValueError, match="empty"):
            writer.write("c", b"")
        with pytest.raises(TypeError, match="keys must be str"):
            writer.write(3, b"\xc0")
    assert MsgpackReader(tmp_path / "set.msgpack")[:] == [
        {"key": "a", "v": 1}, {"key": "b", "v": 2}, None]


def test_progress_bar_is_opt_in(tmp_path, capsys):
    write(tmp_path / "quiet.msgpack", make_samples(3))
    assert capsys.readouterr().err == ""
    write(tmp_path / "bar.msgpack", make_samples(3), progress=True)
    assert "bar.msgpack" in capsys.readouterr().err
    write(tmp_path / "desc.msgpack", make_samples(3), desc="writing", total=3)
    assert "writing" in capsys.readouterr().err
    write(tmp_path / "off.msgpack", make_samples(3), desc="x", disable=True)
    assert capsys.readouterr().err == ""


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fpipe-writer"]


def test_a_dropped_writer_stops_its_thread_and_closes_its_file(tmp_path):
    writer = FileWriter(tmp_path / "set.msgpack", buffering=1 << 16)
    for sample in make_samples(200, size=1000):
        writer.write(sample)
    assert _writer_threads()
    fd = writer._sink._fd
    del writer
    gc.collect()
    assert not _writer_threads()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_an_error_in_the_writing_thread_reaches_the_writer(tmp_path, monkeypatch):
    def failing(fd, block):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(writer_module, "_write_all", failing)
    writer = FileWriter(tmp_path / "set.msgpack", buffering=1 << 16)
    with pytest.raises(OSError, match="No space"):
        for sample in make_samples(1000, size=1000):
            writer.write(sample)
    with pytest.raises(OSError, match="No space"):
        writer.close()
    assert not _writer_threads() and not (tmp_path / "set.msgpack.offsets").exists()


def test_rebuild_index_reproduces_the_writer_index(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    files = DatasetFiles(path)
    before = {p: p.read_bytes() for p in (*files.index_files, files.md5)}
    for p in before:
        p.unlink()
    report = rebuild_index(path)
    assert report == writer_module.RebuildReport(len(samples), os.path.getsize(path), 0)
    assert {p: p.read_bytes() for p in before} == before


def test_rebuild_index_reports_its_progress_in_bytes_up_to_the_last_whole_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "_PROGRESS_EVERY", 3)
    samples = make_samples(10)
    ends = list(itertools.accumulate(len(pack_sample(sample)) for sample in samples))
    path = write(tmp_path / "set.msgpack", samples)
    os.truncate(path, os.path.getsize(path) - 3)  # the last sample is cut
    seen = []
    report = rebuild_index(path, progress=seen.append)
    # every third offset (the ends of samples 1, 4 and 7), then the end of the last whole one
    assert seen == [ends[1], ends[4], ends[7], ends[8]] and ends[8] == report.valid_bytes


def test_rebuild_index_recovers_a_truncated_file(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    size = os.path.getsize(path)
    os.truncate(path, size - 3)
    report = rebuild_index(path)
    assert report.samples == len(samples) - 1 and report.incomplete_bytes == size - 3 - report.valid_bytes
    assert os.path.getsize(path) == report.valid_bytes
    reader = MsgpackReader(path)
    assert reader[:] == samples[:-1] and reader.verify_data()


def test_rebuild_index_without_truncation_leaves_the_tail(tmp_path, samples):
    path = write(tmp_path / "set.msgpack", samples)
    with open(path, "ab") as file:
        file.write(b"\x82\xa3key")
    report = rebuild_index(path, truncate=False)
    assert report.samples == len(samples) and report.incomplete_bytes == 5
    reader = MsgpackReader(path)
    assert reader[:] == samples and not reader.verify_data()


def test_rebuild_index_stops_at_corruption(tmp_path):
    good = b"".join(pack_sample({"key": str(i)}) for i in range(3))
    (tmp_path / "set.msgpack").write_bytes(good + b"\xc1" + pack_sample({"key": "late"}))
    report = rebuild_index(tmp_path / "set.msgpack")
    assert report.samples == 3 and report.valid_bytes == len(good)
    assert [s["key"] for s in MsgpackReader(tmp_path / "set.msgpack")] == ["0", "1", "2"]


@pytest.mark.parametrize("content, match", [
    (pack_sample({"key": 1}), "str"), (pack_sample([1, 2]), "str"),
    (pack_sample({"key": "a"}) * 2, "duplicate key 'a'")])
def test_rebuild_index_needs_unique_str_keys(tmp_path, content, match):
    (tmp_path / "set.msgpack").write_bytes(content)
    with pytest.raises(FormatError, match=match):
        rebuild_index(tmp_path / "set.msgpack")


def test_rebuild_index_of_an_empty_file(tmp_path):
    (tmp_path / "set.msgpack").write_bytes(b"")
    assert rebuild_index(tmp_path / "set.msgpack").samples == 0
    assert list(MsgpackReader(tmp_path / "set.msgpack")) == []


KILLED_WRITER = """
import os, sys
from fpipe.storage import FileWriter
writer = FileWriter(sys.argv[1], buffering=0)
for i in range(100):
    writer.write({"key": str(i), "payload": b"x" * 100})
os._exit(3)
"""


def test_a_killed_writer_is_recovered_by_rebuild_index(tmp_path):
    path = tmp_path / "killed.msgpack"
    result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)])
    assert result.returncode == 3 and not DatasetFiles(path).offsets.exists()
    report = rebuild_index(path)
    assert report.samples == 100 and report.incomplete_bytes == 0
    reader = MsgpackReader(path)
    assert reader[99] == {"key": "99", "payload": b"x" * 100} and reader.verify_data()
    assert read_md5(path)["killed.msgpack"]
