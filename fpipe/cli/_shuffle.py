"""The shuffle of ``fpipe write --shuffle``: any number of entries, in bounded memory.

One pass deals each entry, as a line of JSON, into one of ``k`` bucket files chosen at random
by the seed; each pass over the shuffled entries reads the buckets back one at a time and
permutes each by the seed. Dealing at random, permuting each bucket uniformly and putting the
buckets one after the other gives every order of the entries the same chance. There are as
many buckets as it takes for each to hold about :data:`BUCKET_ENTRIES` entries, the most held
in memory at once; the dealt lines wait in memory up to :data:`DEALT_BYTES` before they are
appended to their buckets. Up to :data:`BUCKET_ENTRIES` entries there is one bucket, and the
order is the permutation that ``fpipe.random.item_rng(seed, 0, 0)`` draws.

>>> import tempfile
>>> from pathlib import Path
>>> from fpipe.cli._inputs import Entry
>>> entries = [Entry(f"k{i}", f"p{i}") for i in range(6)]
>>> with shuffled_entries(entries, 3, Path(tempfile.mkdtemp()) / "out") as shuffled:
...     len(shuffled), sorted(entry.key for entry in shuffled) == sorted(e.key for e in entries)
...     list(shuffled) == list(shuffled)
(6, True)
True
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fpipe.cli._inputs import Entry
from fpipe.dataset._staging import DISK_FULL, disk_full, folder_size
from fpipe.random import item_rng

__all__ = ["BUCKET_ENTRIES", "DEALT_BYTES", "ShuffledEntries", "shuffled_entries"]

#: Entries a bucket holds, on average: the entries in memory at once (a few hundred bytes each).
BUCKET_ENTRIES = 1 << 17
#: Bytes of dealt lines held in memory before they are appended to their bucket files.
DEALT_BYTES = 1 << 24
_DEAL_CHUNK = 4096  # bucket numbers drawn at once


@contextmanager
def shuffled_entries(entries: Iterable[Entry], seed: int, beside: Path
                     ) -> Iterator[ShuffledEntries]:
    """``entries`` shuffled by ``seed``, dealt into bucket files in a hidden folder beside
    ``beside`` (in the system's temporary folder if its folder does not exist yet), which is
    removed with them on leaving the block, however it is left."""
    parent = beside.parent if beside.parent.is_dir() else None
    folder = tempfile.mkdtemp(prefix=".fpipe-shuffle-", dir=parent)
    try:
        yield _dealt(entries, seed, folder, beside)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _dealt(entries: Iterable[Entry], seed: int, folder: str, beside: Path) -> ShuffledEntries:
    """The entries dealt into ``folder``; a full disk is reported against ``beside``."""
    try:
        return ShuffledEntries.dealt(entries, seed, folder)
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        written = folder_size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        raise disk_full(error, beside, written, " into the bucket files of --shuffle") from error


class ShuffledEntries:
    """Entries dealt into ``buckets`` files in ``folder`` by :func:`shuffled_entries`,
    ``count`` in all; each iteration reads the buckets again, one at a time, and yields each
    permuted by ``seed`` (the same order every time)."""

    def __init__(self, folder: str, buckets: int, count: int, seed: int) -> None:
        self.folder, self.buckets, self.count, self.seed = folder, buckets, count, seed

    @classmethod
    def dealt(cls, entries: Iterable[Entry], seed: int, folder: str) -> ShuffledEntries:
        """Deal ``entries`` into buckets in ``folder``: as many as ``len(entries)`` (a hint:
        the entries dealt are counted) takes for each to hold about :data:`BUCKET_ENTRIES`."""
        hint = len(entries) if hasattr(entries, "__len__") else 0
        buckets = max(1, -(-hint // BUCKET_ENTRIES))
        shuffled = cls(folder, buckets, 0, seed)
        shuffled.count = shuffled._deal(iter(entries))
        return shuffled

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Entry]:
        for bucket in range(self.buckets):
            yield from self._permuted(bucket)

    def _deal(self, entries: Iterator[Entry]) -> int:
        waiting: list[list[str]] = [[] for _ in range(self.buckets)]
        count = held = 0
        for entry, bucket in zip(entries, _bucket_numbers(self.seed, self.buckets)):
            line = json.dumps([entry.key, entry.path, entry.label, entry.sample]) + "\n"
            waiting[bucket].append(line)
            count, held = count + 1, held + len(line)
            if held > DEALT_BYTES:
                self._append(waiting)
                held = 0
        self._append(waiting)
        return count

    def _append(self, waiting: list[list[str]]) -> None:
        """Append the lines waiting for each bucket to its file, and forget them."""
        for bucket, lines in enumerate(waiting):
            if lines:
                with open(self._path(bucket), "a", encoding="utf-8") as file:
                    file.writelines(lines)
                lines.clear()

    def _permuted(self, bucket: int) -> list[Entry]:
        path = self._path(bucket)
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as file:
            entries = [Entry(*json.loads(line)) for line in file]
        order = item_rng(self.seed, 0, bucket).permutation(len(entries))
        return [entries[i] for i in order.tolist()]

    def _path(self, bucket: int) -> str:
        # no Path: pathlib interns the parts of every path it parses, and the table of
        # interned strings grows (in steps of its whole size) with the number of buckets
        return os.path.join(self.folder, f"{bucket}.jsonl")


def _bucket_numbers(seed: int, buckets: int) -> Iterator[int]:
    """Endless bucket numbers below ``buckets`` drawn by ``seed``, :data:`_DEAL_CHUNK` at a
    time (numpy's draws depend on how many are drawn at once)."""
    draw = item_rng(seed, 1, 0)
    while True:
        yield from draw.integers(buckets, size=_DEAL_CHUNK).tolist()
