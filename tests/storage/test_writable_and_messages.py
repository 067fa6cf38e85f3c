"""Arrays from copy=True are writable on every read path, copy=False keeps read-only views;
and the messages for a folder, garbage bytes and a truncated file say what is there."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from fpipe.dataset import FileWriter, MsgpackReader, ShardedReader
from fpipe.errors import FormatError
from fpipe.orderings import QuasiShuffler, Shuffler


@pytest.fixture(scope="module", params=[3, 5000], ids=["small", "large"])
def path(request, tmp_path_factory):
    # small samples decode through one Unpacker per chunk, large ones one by one
    path = tmp_path_factory.mktemp("arrays") / "x.msgpack"
    with FileWriter(path) as writer:
        for i in range(20):
            writer.write({"key": f"{i:02d}", "a": np.full(request.param, i, np.int32),
                          "nested": [{"b": np.zeros(2)}]})
    return str(path)


def _arrays(sample):
    return [sample["a"], sample["nested"][0]["b"]]


def _reads(reader, copy):
    yield reader.get(3, copy=copy)
    yield from reader.get_slice(2, 9, copy=copy)
    yield from reader.get_many([9, 1, 2], copy=copy)
    yield from reader.iter(0, 20, copy=copy, chunk_size=4)
    yield from reader.slice(5, 8, copy=copy)
    yield from ShardedReader([reader, reader]).iter(15, 25, copy=copy)
    yield from Shuffler(reader, seed=0).iter(copy=copy)
    yield from QuasiShuffler(reader, 4, 2, seed=0).iter(copy=copy)


def test_copy_gives_writable_arrays_on_every_path(path):
    samples = list(_reads(MsgpackReader(path), copy=True))
    assert len(samples) == 1 + 7 + 3 + 20 + 3 + 10 + 20 + 20
    for sample in samples:
        for array in _arrays(sample):
            array += 1  # raises if read-only
    assert all(array.flags.writeable for sample in samples for array in _arrays(sample))


def test_copy_false_gives_read_only_views(path):
    for sample in _reads(MsgpackReader(path), copy=False):
        assert not any(array.flags.writeable for array in _arrays(sample))
    sample = MsgpackReader(path).get(0, copy=False)
    with pytest.raises(ValueError, match="read-only"):
        sample["a"] += 1  # numpy's own message; docs/faq.md explains it under these words


def test_a_folder_is_named_a_folder(tmp_path):
    with pytest.raises(IsADirectoryError, match="a folder, not a dataset data file") as raised:
        MsgpackReader(tmp_path)
    assert raised.value.errno == errno.EISDIR and "DirectoryReader" in str(raised.value)
    with FileWriter(tmp_path / "train.msgpack") as writer:
        writer.write({"key": "a"})
    with pytest.raises(IsADirectoryError, match="it holds train.msgpack"):
        MsgpackReader(tmp_path)


def test_garbage_bytes_say_what_was_found(tmp_path):
    path = tmp_path / "x.msgpack"
    with FileWriter(path) as writer:
        writer.write({"key": "a", "text": "x" * 30})
    size = path.stat().st_size
    path.write_bytes(b"hello, not msgpack at all".ljust(size, b"!"))
    reader = MsgpackReader(path)
    expected = (r"corrupt sample: not one msgpack message but an int followed by \d+ more bytes; "
                r"its bytes begin b'hello, not msgpa'")
    with pytest.raises(FormatError, match=expected):
        reader.get(0)
    with pytest.raises(FormatError, match=expected):
        list(reader)
    path.write_bytes(b"\xc1" * size)  # a byte that begins no msgpack type
    with pytest.raises(FormatError, match=r"corrupt sample: not msgpack \(FormatError\); "
                                          r"its bytes begin b'\\xc1"):
        MsgpackReader(path).get(0)


def test_a_truncated_file_points_to_fpipe_index(tmp_path):
    path = tmp_path / "x.msgpack"
    with FileWriter(path) as writer:
        for i in range(3):
            writer.write({"key": str(i)})
    path.write_bytes(path.read_bytes()[:-3])
    for read in (lambda r: r.get(2), list):
        with pytest.raises(FormatError, match=f"truncated: .*'fpipe index {path}' keeps every "
                                              "complete sample"):
            read(MsgpackReader(path))
