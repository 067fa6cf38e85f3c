"""A reader made from a relative path reads the same files after the current folder changes:
in its own process (it opens its files lazily), in a pickled copy, and in worker processes
that were started in another folder (a warm pool keeps the folder it started in). A writer's
files land where they were asked for."""

import os
import pickle
import zipfile

import pytest

from fpipe.dataset import FileWriter, MsgpackReader, ZipFileReader
from fpipe.formats import TFRecordReader, TFRecordWriter
from fpipe.stream import processes


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """Two folders, ``data`` (current) and ``elsewhere``."""
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "data")
    return tmp_path


def _packed():
    with FileWriter("train.msgpack") as writer:
        for i in range(4):
            writer.write({"key": str(i), "v": i})
    return MsgpackReader("train.msgpack")


def _tfrecord():
    with TFRecordWriter("train.tfrecord") as writer:
        for i in range(4):
            writer.write({"v": [i]})
    return TFRecordReader("train.tfrecord")


def _zipped():
    with zipfile.ZipFile("train.zip", "w") as archive:
        for i in range(4):
            archive.writestr(f"digits/{i}.txt", str(i))
    return ZipFileReader("train.zip")


def _value(sample) -> int:
    """The number sample ``i`` holds: ``v`` (an int, or an int64 array of one) or a file's bytes."""
    value = sample["v"] if "v" in sample else sample["data"]
    return int(value if isinstance(value, (int, bytes)) else value[0])


@pytest.mark.parametrize("make", [_packed, _tfrecord, _zipped])
def test_a_reader_and_its_copy_read_the_same_files_from_another_folder(folders, make):
    reader = make()
    copy = pickle.dumps(reader)
    os.chdir(folders / "elsewhere")
    assert [_value(reader.get(i)) for i in range(4)] == [0, 1, 2, 3]
    assert [_value(pickle.loads(copy).get(i)) for i in range(4)] == [0, 1, 2, 3]


def _folder_and_value(reader, index):
    return os.getcwd(), reader.get(index)["v"]


def test_workers_started_in_another_folder_read_a_reader_made_from_a_relative_path(folders):
    os.chdir(folders / "elsewhere")
    # the workers start here, in "elsewhere" (unless a pool is warm already), and stay warm
    assert len(list(processes(os.path.basename, n_workers=2)(["a", "b"]))) == 2
    os.chdir(folders / "data")
    reader = _packed()
    got = list(processes(lambda index: _folder_and_value(reader, index), n_workers=2)(range(4)))
    assert [value for _, value in got] == [0, 1, 2, 3]
    # the pool started elsewhere (here, or earlier, in another folder), not in "data"
    assert str(folders / "data") not in {folder for folder, _ in got}


def test_a_writer_made_from_a_relative_path_closes_into_the_folder_it_was_made_in(folders):
    with FileWriter("train.msgpack") as writer:
        writer.write({"key": "0", "v": 0})
        os.chdir(folders / "elsewhere")
        writer.write({"key": "1", "v": 1})
    assert os.listdir(folders / "elsewhere") == []
    reader = MsgpackReader(folders / "data" / "train.msgpack")
    assert [reader.get(i)["v"] for i in range(2)] == [0, 1]
    assert reader.verify_data()
