"""Workloads of the packed-dataset layer: S1-S5 against datadings, and M1 (worker memory)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from fpipe.dataset import FileWriter, MsgpackReader

from . import data
from .harness import Pair, Value, workload


def _datadings():
    from datadings.reader import MsgpackReader as Reader
    from datadings.writer import FileWriter as Writer

    return Reader, Writer


@workload("S1", description="write `small` with the sample writer (index and md5 included)",
          reference="datadings FileWriter", target=">= 1.5")
def write_small() -> Pair:
    samples = data.small_samples()
    folder = Path(tempfile.mkdtemp(prefix="fpipe-s1-"))
    _, DatadingsWriter = _datadings()

    def ours() -> None:
        with FileWriter(folder / "fpipe.msgpack", overwrite=True) as writer:
            for sample in samples:
                writer.write(sample)

    def theirs() -> None:
        with DatadingsWriter(folder / "datadings.msgpack", overwrite=True, disable=True) as writer:
            for sample in samples:
                writer.write(sample)
    return Pair(fpipe=ours, reference=theirs, items=len(samples),
                teardown=lambda: shutil.rmtree(folder, ignore_errors=True))


def _readers(path: str) -> tuple:
    DatadingsReader, _ = _datadings()
    return MsgpackReader(path), DatadingsReader(path)


def _drain(iterable) -> None:
    for _ in iterable:
        pass


@workload("S2", description="iterate `small` in file order, decoded",
          reference="datadings MsgpackReader iteration", target=">= 1.5")
def iterate_small() -> Pair:
    ours, theirs = _readers(data.small_path())
    return Pair(fpipe=lambda: _drain(ours), reference=lambda: _drain(theirs), items=len(ours))


def _random_gets(path: str) -> Pair:
    ours, theirs = _readers(path)
    order = np.random.default_rng(0).permutation(len(ours)).tolist()

    def run(get) -> None:
        for index in order:
            get(index)
    return Pair(fpipe=lambda: run(ours.get), reference=lambda: run(theirs.get), items=len(order))


@workload("S3", description="random get over `small` (a fixed permutation, seed 0)",
          reference="datadings get", target=">= 1.2")
def random_get_small() -> Pair:
    return _random_gets(data.small_path())


@workload("S4", description="random get over `large` (a fixed permutation, seed 0)",
          reference="datadings get", target=">= 1.3")
def random_get_large() -> Pair:
    return _random_gets(data.large_path())


@workload("S4c", description="the ceiling of S4 for a reader that never maps its file: one bare "
          "os.pread of each sample's bytes, in the order of S4, nothing decoded",
          reference="datadings get", target="-")
def random_pread_large() -> Pair:
    path = data.large_path()
    _, theirs = _readers(path)
    offsets = np.fromfile(path + ".offsets", dtype=">u8").tolist()
    order = np.random.default_rng(0).permutation(len(offsets) - 1).tolist()

    def bare_reads() -> None:
        with open(path, "rb", buffering=0) as file:
            fd = file.fileno()
            for index in order:
                os.pread(fd, offsets[index + 1] - offsets[index], offsets[index])

    def run(get) -> None:
        for index in order:
            get(index)
    return Pair(fpipe=bare_reads, reference=lambda: run(theirs.get), items=len(order))


@workload("S5", description="open + len + first get on `small`, then a first key lookup",
          reference="datadings", target="<= 1.0", kind="time")
def open_small() -> Pair:
    path = data.small_path()
    DatadingsReader, _ = _datadings()

    def first_use(make) -> None:
        reader = make(path)
        len(reader)
        reader.get(0)
        reader.find_index("00054321")
    return Pair(fpipe=lambda: first_use(MsgpackReader), reference=lambda: first_use(DatadingsReader))


class _Growth:
    """The last item a worker yields: how much its unique memory grew over its pass."""

    def __init__(self, value: int) -> None:
        self.value = value


def _collate(batch: list) -> tuple[int, list[int]]:
    growths = [item.value for item in batch if isinstance(item, _Growth)]
    return len(batch) - len(growths), growths


def _worker_pass(reader: MsgpackReader):
    import psutil
    import torch

    info = torch.utils.data.get_worker_info()
    workers, worker = (info.num_workers, info.id) if info else (1, 0)
    start, stop = len(reader) * worker // workers, len(reader) * (worker + 1) // workers
    process = psutil.Process()
    before = process.memory_full_info().uss
    yield from reader.iter(start, stop)
    yield _Growth(process.memory_full_info().uss - before)


def _iterable_dataset(reader: MsgpackReader):
    import torch

    class Shards(torch.utils.data.IterableDataset):
        def __iter__(self):
            return _worker_pass(reader)
    return Shards()


@workload("M1", description="forked DataLoader workers (2) iterating `tiny` (2,000,000 samples of "
          "16 bytes) after the parent has read: largest growth of a worker's unique memory",
          reference="-", target="<= 16", kind="value")
def worker_memory() -> Value:
    import torch

    reader = MsgpackReader(data.tiny_path())
    assert reader[0]["key"] == "00000000" and len(reader) == 2_000_000  # the parent reads first
    loader = torch.utils.data.DataLoader(_iterable_dataset(reader), batch_size=4096, num_workers=2,
                                         collate_fn=_collate, multiprocessing_context="fork")
    counted, growths = 0, []
    for count, grown in loader:
        counted += count
        growths += grown
    assert counted == len(reader) and len(growths) == 2
    return Value(max(growths) / 2**20, "MiB")
