"""Readers shared by threads, forked workers and spawned processes."""

import multiprocessing
import os
import threading

import numpy as np
import pytest

from fpipe.dataset import MsgpackReader, ZipFileReader

from .conftest import make_samples, write


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    samples = make_samples(2000, size=64)
    return samples, write(tmp_path_factory.mktemp("shared") / "set.msgpack", samples)


def _hammer(reader, samples, seed, errors):
    rng = np.random.default_rng(seed)
    try:
        for i in rng.integers(0, len(samples), 3000).tolist():
            if reader.get(i) != samples[i]:
                errors.append(f"wrong sample at {i}")
        for start in rng.integers(0, len(samples), 5).tolist():
            if list(reader.iter(start, start + 100, chunk_size=7)) != samples[start:start + 100]:
                errors.append(f"wrong iteration from {start}")
        if reader.find_index(samples[seed]["key"]) != seed or samples[seed]["key"] not in reader:
            errors.append("wrong key lookup")
    except Exception as error:  # any exception in a thread is a failure of the test
        errors.append(repr(error))


def test_eight_threads_doing_random_gets_on_one_reader(shared):
    samples, path = shared
    reader, errors = MsgpackReader(path), []
    threads = [threading.Thread(target=_hammer, args=(reader, samples, seed, errors)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_closing_while_threads_read_never_gives_wrong_samples(shared):
    samples, path = shared
    reader, errors, stop = MsgpackReader(path), [], threading.Event()

    def closer():
        while not stop.is_set():
            reader.close()
    thread = threading.Thread(target=closer)
    thread.start()
    try:
        _hammer(reader, samples, 3, errors)
    finally:
        stop.set()
        thread.join()
    assert errors == []


class _MapDataset:
    """A minimal map-style torch dataset over a reader (the torch adapters live elsewhere)."""

    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, index):
        return self.reader[index]["key"]


def test_forked_dataloader_workers_after_the_parent_has_read(shared):
    torch = pytest.importorskip("torch")
    samples, path = shared
    reader = MsgpackReader(path)
    assert reader[5] == samples[5] and len(list(reader.iter(0, 300))) == 300  # the parent reads
    loader = torch.utils.data.DataLoader(
        _MapDataset(reader), batch_size=64, shuffle=True, num_workers=2,
        multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # datadings's shared file offset garbles about one epoch in three
        keys = [key for batch in loader for key in batch]
        assert sorted(keys) == [s["key"] for s in samples]
    assert reader[7] == samples[7]


def _child_reads(reader, queue):
    queue.put([sample["key"] for sample in reader.iter(10, 20)] + [reader[-1]["key"]])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_used_reader_crosses_into_child_processes(shared, method):
    samples, path = shared
    reader = MsgpackReader(path)
    assert reader.find_key(3) == samples[3]["key"] and reader[0] == samples[0]
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(reader, queue))
    child.start()
    keys = queue.get(timeout=60)
    child.join(timeout=60)
    assert keys == [s["key"] for s in samples[10:20]] + [samples[-1]["key"]]
    assert list(reader.iter(10, 20)) == samples[10:20]


def test_zip_reader_reopens_its_archive_in_forked_children(tmp_path):
    import zipfile

    path = tmp_path / "x.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(50):
            archive.writestr(f"c{i % 2}/{i:03d}.bin", os.urandom(3000))
    reader = ZipFileReader(path)
    expected = [s["data"] for s in reader]
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        results = pool.map(_zip_data, [(reader, i) for i in range(50)] * 4)
    assert results == expected * 4


def _zip_data(args):
    reader, index = args
    return reader[index]["data"]
