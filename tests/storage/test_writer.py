"""Writers: files written, guards, buffering, progress, close-on-error."""

import gc
import os
import shutil
import subprocess
import threading

import msgpack
import pytest

from fpipe.dataset import FileWriter, MsgpackReader, RawWriter, pack_sample
from fpipe.dataset import writer as writer_module
from fpipe.files import DatasetFiles

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


