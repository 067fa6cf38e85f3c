"""A dataset's files changed under an open reader, in a process of its own:
``python -m tests.reliability.changes SCENARIO FOLDER`` prints, as one JSON line, what every
read gave after the change.

A reader that touches a memory-mapped file after another program truncated it dies of SIGBUS.
Run here, such a regression ends this process with a signal, and the test that started it
fails (instead of pytest dying with it).

Scenarios: ``truncate`` (cut the data file to 100 bytes), ``rewrite`` (overwrite the
dataset's files in place with another dataset, as ``cp`` does), ``replace`` (delete the files
and write another dataset at the same path), ``threads`` (readers in four threads while the
file is truncated, then rewritten) and ``dataloader`` (a torch DataLoader with two workers
while the file is truncated).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fpipe.dataset import MsgpackReader, pack_sample
from fpipe.dataset.format import DatasetFiles

from .files import write_dataset

COUNT = 6


def samples(n: int, scale: int) -> list[dict]:
    """``n`` samples of a few hundred KiB (pages of a mapping would span each), whose sizes
    depend on ``scale``, so that two datasets of different scale never line up."""
    return [{"key": f"k{i}", "x": np.full(scale * (i + 1), i, np.float32),
             "b": bytes([i]) * (scale * 3 + i)} for i in range(n)]


def first(n: int = COUNT) -> list[dict]:
    return samples(n, 20_000)


def other(n: int = COUNT) -> list[dict]:
    return samples(n, 23_000)


def same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def outcome(read: Callable[[], object], expected: object) -> str:
    """``ok`` (what was written), ``wrong`` (anything else), or the exception raised."""
    try:
        return "ok" if same(read(), expected) else "wrong"
    except Exception as error:  # the test judges every kind
        return f"{type(error).__name__}: {error}"


def reads(reader: MsgpackReader, expected: list[dict]) -> dict[str, Callable]:
    """Every way to read a sample, each with the answer it must give."""
    kinds = {f"get {i}": (lambda i=i: reader.get(i), expected[i]) for i in range(COUNT)}
    kinds["get_slice"] = (lambda: reader[1:COUNT], expected[1:])
    kinds["get_many"] = (lambda: reader.get_many([5, 1]), [expected[5], expected[1]])
    kinds["iter"] = (lambda: list(reader.iter(chunk_size=2)), expected)
    kinds["raw view"] = (lambda: bytes(reader.get(4, raw=True, copy=False)),
                         pack_sample(expected[4]))
    kinds["raw slice"] = (lambda: reader.get_slice(2, 4, raw=True),
                          [pack_sample(s) for s in expected[2:4]])
    kinds["raw iter"] = (lambda: list(reader.rawiter()), [pack_sample(s) for s in expected])
    return kinds


def all_reads(reader: MsgpackReader, expected: list[dict]) -> dict[str, str]:
    return {name: outcome(read, answer) for name, (read, answer) in reads(reader, expected).items()}


def opened(path: Path) -> MsgpackReader:
    """A reader that has read already: its files are open and its offsets in memory."""
    reader = MsgpackReader(path)
    assert same(reader.get(3), first()[3]) and same(next(reader.iter(0, 1)), first()[0])
    return reader


def copy_in_place(source: Path, target: Path) -> None:
    """What ``cp`` does: truncate each file of ``target`` and write ``source``'s bytes into it."""
    for a, b in zip(DatasetFiles(source).index_files + (source,),
                    DatasetFiles(target).index_files + (target,)):
        if a.exists():
            with open(a, "rb") as src, open(b, "wb") as dst:
                shutil.copyfileobj(src, dst)


def truncate(folder: Path) -> dict:
    path = write_dataset(folder / "set.msgpack", first())
    reader = opened(path)
    os.truncate(path, 100)
    return {"path": str(path), "reads": all_reads(reader, first())}


def rewrite(folder: Path) -> dict:
    path = write_dataset(folder / "set.msgpack", first())
    replacement = write_dataset(folder / "other" / "set.msgpack", other())
    reader = opened(path)
    copy_in_place(replacement, path)
    return {"path": str(path), "reads": all_reads(reader, first()),
            "new reader": all_reads(MsgpackReader(path), other())}


def replace(folder: Path) -> dict:
    path = write_dataset(folder / "set.msgpack", first())
    reader = opened(path)
    copied = pickle.loads(pickle.dumps(reader))  # what a worker process gets
    for file in DatasetFiles(path).index_files + (path,):
        file.unlink(missing_ok=True)
    write_dataset(path, other())
    kept = all_reads(reader, first())  # the open files are the old ones, whole
    reader.close()
    return {"path": str(path), "reads": kept, "reopened": outcome(lambda: reader.get(0), None),
            "unpickled": outcome(lambda: copied.get(0), None),
            "new reader": all_reads(MsgpackReader(path), other())}


class _Reading(threading.Thread):
    """Reads samples in a loop until told to stop, counting what each read gave."""

    def __init__(self, reader: MsgpackReader, expected: list[dict], seed: int) -> None:
        super().__init__(daemon=True)
        self.reader, self.expected, self.seed = reader, expected, seed
        self.outcomes: Counter = Counter()
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        kinds = list(reads(self.reader, self.expected).values())
        rng = np.random.default_rng(self.seed)
        while not self.stop.is_set():
            read, answer = kinds[rng.integers(len(kinds))]
            result = outcome(read, answer)
            self.outcomes["ok" if result == "ok" else result.split(":")[0]] += 1
            self.reads += 1


def _wait_for_reads(threads: list[_Reading], more: int) -> None:
    targets = [t.reads + more for t in threads]
    for thread, target in zip(threads, targets):
        while thread.reads < target and thread.is_alive():
            thread.stop.wait(0.001)


def threads(folder: Path) -> dict:
    path = write_dataset(folder / "set.msgpack", first())
    replacement = write_dataset(folder / "other" / "set.msgpack", other())
    reader = opened(path)
    readers = [_Reading(reader, first(), seed) for seed in range(4)]
    for thread in readers:
        thread.start()
    _wait_for_reads(readers, 20)
    os.truncate(path, 100)
    _wait_for_reads(readers, 20)
    copy_in_place(replacement, path)
    _wait_for_reads(readers, 20)
    for thread in readers:
        thread.stop.set()
        thread.join()
    total = sum((t.outcomes for t in readers), Counter())
    return {"path": str(path), "outcomes": dict(total)}


def as_list(batch: list) -> list:
    return batch


def dataloader(folder: Path) -> dict:
    import torch

    import fpipe.torch as ft

    path = write_dataset(folder / "set.msgpack", samples(64, 2_000))
    loader = torch.utils.data.DataLoader(ft.Dataset(MsgpackReader(path)), batch_size=2,
                                         num_workers=2, collate_fn=as_list)
    batches = iter(loader)
    first_batch = next(batches)
    os.truncate(path, 100)
    try:
        rest = sum(1 for _ in batches)
        error = None
    except Exception as caught:  # the test judges every kind
        rest, error = None, f"{type(caught).__name__}: {caught}"
    return {"path": str(path), "first": [s["key"] for s in first_batch], "rest": rest,
            "error": error}


SCENARIOS = {f.__name__: f for f in (truncate, rewrite, replace, threads, dataloader)}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](Path(sys.argv[2]))), flush=True)
