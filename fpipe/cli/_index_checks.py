"""The index checks of ``fpipe verify``, in bounded memory at any number of samples: offsets
are read a window at a time, keys a batch at a time, and repeated keys are found by sorting
their hashes by partitions in the temporary folder (16 bytes a sample there), comparing only
the keys whose hashes are equal.

>>> import tempfile, msgpack
>>> from fpipe.dataset import write_index
>>> files = DatasetFiles(Path(tempfile.mkdtemp()) / "x.msgpack")
>>> write_index(files.data, ["a", "b", "c"], [0, 3, 5, 7], "0" * 32)
>>> _ = files.keys.write_bytes(msgpack.packb(["a", "b", "a"]))
>>> index = read_index(files)
>>> index.count, offset_problems(index, 9), key_problems(index, lambda done: None)
(3, (['data file has 2 bytes after its last sample (byte 7)'], False), ['index: 1 duplicate keys'])
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from fpipe.cli._common import key_batches
from fpipe.dataset import BloomFilter, legacy_index_batches
from fpipe.dataset._indexing import array_length
from fpipe.dataset.keyindex import SortedPairs, key_salt, salted_hashes
from fpipe.errors import FormatError
from fpipe.files import DatasetFiles, open_regular

__all__ = ["Index", "OffsetChecks", "key_problems", "keys_and_offsets", "offset_problems",
           "read_index"]

_WINDOW = 1 << 20  # offsets or hashes looked at a time
_BATCH = 1 << 16  # keys looked at a time


@dataclass
class Index:
    """A dataset's index as verify reads it: its ``count`` keys and ``offset_count`` offsets,
    read from its files as they are wanted (a legacy ``.index``'s keys from its map as they are
    wanted, and its offsets from a temporary file that they were copied to: ``legacy``)."""

    files: DatasetFiles
    count: int
    offset_count: int
    legacy: IO[bytes] | None = None

    def offsets(self, low: int, high: int) -> np.ndarray:
        """Offsets ``low`` to ``high`` (not included), as int64."""
        if self.legacy is not None:
            data = os.pread(self.legacy.fileno(), 8 * (high - low), 8 * low)
            return np.frombuffer(data, dtype=">u8").astype(np.int64)
        with open_regular(self.files.offsets) as file:
            data = os.pread(file.fileno(), 8 * (high - low), 8 * low)
        if len(data) != 8 * (high - low):
            raise FormatError(f"it ends before offset {high}", path=self.files.offsets)
        return np.frombuffer(data, dtype=">u8").astype(np.int64)

    def key_batches(self, size: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """The keys in order, as ``(index of the first, keys)`` batches (of 65,536 unless
        ``size`` is given)."""
        size = size or _BATCH
        if self.legacy is None:
            yield from key_batches(self.files.keys, size)
            return
        first = 0
        for keys, _ in legacy_index_batches(self.files.data, size):
            yield first, keys
            first += len(keys)


def read_index(files: DatasetFiles) -> Index:
    """The index of the dataset ``files`` (its ``.offsets`` and ``.keys``, or its legacy
    ``.index``); FileNotFoundError or FormatError if there is none to read."""
    if not files.offsets.exists():
        if files.legacy_index.exists():
            return _legacy_index(files)
        raise FileNotFoundError(f"{files.offsets.name} is missing")
    if not files.keys.exists():
        raise FileNotFoundError(f"{files.keys.name} is missing")
    with open_regular(files.offsets) as file:
        size = os.fstat(file.fileno()).st_size
    if size % 8 or not size:
        raise FormatError(f"an offsets file holds n + 1 uint64; got {size} bytes",
                          path=files.offsets)
    return Index(files, array_length(files.keys), size // 8)


def _legacy_index(files: DatasetFiles) -> Index:
    """The :class:`Index` of a legacy ``.index``: its offsets copied to a temporary file (8
    bytes a sample, removed when the index is dropped) as its map is read a batch at a time."""
    spilled = tempfile.TemporaryFile(prefix="fpipe-verify-")
    count = 0
    try:
        for keys, starts in legacy_index_batches(files.data):
            spilled.write(starts.astype(">u8").tobytes())
            count += len(keys)
        spilled.write(np.array([files.data.stat().st_size], ">u8").tobytes())
        spilled.flush()
    except BaseException:
        spilled.close()
        raise
    return Index(files, count, count + 1, spilled)


class OffsetChecks:
    """The checks of an index's offsets against its data file, made as the offsets come, in
    order, a window at a time (:meth:`add`), in the same memory at any number of samples.

    >>> checks = OffsetChecks()
    >>> checks.add(np.array([0, 4, 4])); checks.add(np.array([2, 9]))
    >>> checks.problems(9)
    (['index: sample 1 at byte 4 is empty or ends before it starts (2 such samples)'], True)
    """

    def __init__(self) -> None:
        self.first: int | None = None
        self.end: int | None = None
        self.steps, self.first_step = 0, (0, 0)
        self._seen = 0

    def add(self, offsets: np.ndarray) -> None:
        """The next offsets (int64)."""
        if not len(offsets):
            return
        if self.end is None:
            window, low, self.first = offsets, 0, int(offsets[0])
        else:
            window, low = np.concatenate([np.array([self.end], np.int64), offsets]), self._seen - 1
        steps = np.flatnonzero(np.diff(window) <= 0)
        if steps.size and not self.steps:
            self.first_step = (low + int(steps[0]), int(window[steps[0]]))
        self.steps += steps.size
        self._seen += len(offsets)
        self.end = int(offsets[-1])

    def problems(self, size: int) -> tuple[list[str], bool]:
        """The problems of the offsets added against a data file of ``size`` bytes, and
        whether they are too broken to find the samples by."""
        first, end, problems = self.first or 0, self.end or 0, []
        if first != 0:
            problems.append(f"index: the first sample starts at byte {first}, not 0")
        if self.steps:
            where = self.first_step
            problems.append(f"index: sample {where[0]} at byte {where[1]} is empty or ends "
                            f"before it starts ({self.steps} such samples)")
        if end > size:
            problems.append(f"data file is truncated: the index ends at byte {end}, the file "
                            f"has {size} bytes")
        elif end < size:
            problems.append(f"data file has {size - end} bytes after its last sample (byte "
                            f"{end})")
        return problems, bool(first != 0 or self.steps or end > size)


def offset_problems(index: Index, size: int) -> tuple[list[str], bool]:
    """The problems of the offsets against a data file of ``size`` bytes, and whether they
    are too broken to find the samples by."""
    n, problems = index.offset_count, []
    if n != index.count + 1:
        problems.append(f"index: {n - 1} offsets for {index.count} keys")
    checks = OffsetChecks()
    for low in range(0, n, _WINDOW):
        checks.add(index.offsets(low, min(n, low + _WINDOW)))
    found, broken = checks.problems(size)
    return problems + found, broken


def key_problems(index: Index, tick: Callable[[int], object]) -> list[str]:
    """Repeated keys; else the key hashes and the Bloom filter that do not match the keys.
    ``tick`` is told how many keys each batch of the first pass held (a progress bar)."""
    repeated = _repeated_keys(index, tick)
    if repeated:
        return [f"index: {repeated} duplicate keys"]
    problems = []
    for check in (_key_hash_problems, _filter_problems):
        try:
            problems += check(index)
        except (FormatError, OSError, ValueError) as error:
            problems.append(f"index: {error}")
    return problems


def _repeated_keys(index: Index, tick: Callable[[int], object]) -> int:
    """How many samples have the key of an earlier one."""
    with tempfile.TemporaryDirectory(prefix="fpipe-verify-") as folder:
        pairs = SortedPairs(index.count, Path(folder))
        for first, keys in index.key_batches():
            pairs.add(salted_hashes(keys, key_salt(0)), first)
            tick(len(keys))
        groups = pairs.equal_hashes()
    if not groups:
        return 0
    keys = _keys_at(index, {i for group in groups for i in group})
    return sum(len(group) - len({keys[i] for i in group}) for group in groups)


def _keys_at(index: Index, wanted: set[int]) -> dict[int, str]:
    """The keys of the samples ``wanted``, by one more pass over the keys."""
    found = {}
    for first, keys in index.key_batches():
        found.update((i, keys[i - first]) for i in wanted if first <= i < first + len(keys))
    return found


def _key_hash_problems(index: Index) -> list[str]:
    path = index.files.key_hashes
    if not path.exists():
        return []
    with open_regular(path) as file:
        salt, size = os.pread(file.fileno(), 8, 0), os.fstat(file.fileno()).st_size
        if size < 8 or size % 8:
            raise FormatError(f"a key hashes file holds a salt and n uint64; got {size} bytes",
                              path=path)
        if size // 8 - 1 != index.count:
            return [f"{path.name}: {size // 8 - 1} hashes for {index.count} keys"]
        wrong, first_wrong = _unmatched_hashes(index, file.fileno(), salt)
    if wrong:
        return [f"{path.name}: {wrong} hashes do not match their keys (first: sample "
                f"{first_wrong})"]
    return []


def _unmatched_hashes(index: Index, fd: int, salt: bytes) -> tuple[int, int]:
    """How many stored hashes (file ``fd``) differ from their keys' hashes, and the first."""
    wrong, first_wrong = 0, -1
    for first, keys in index.key_batches():
        stored = np.frombuffer(os.pread(fd, 8 * len(keys), 8 + 8 * first), dtype=">u8")
        differ = np.flatnonzero(stored != salted_hashes(keys, salt))
        if differ.size and first_wrong < 0:
            first_wrong = first + int(differ[0])
        wrong += differ.size
    return wrong, first_wrong


def _filter_problems(index: Index) -> list[str]:
    path = index.files.filter
    if not path.exists():
        return []
    with open_regular(path) as file:
        data = file.read()
    try:
        bloom = BloomFilter.loads(data)
    except ValueError as error:
        raise FormatError(f"corrupt Bloom filter ({error})", path=path) from error
    absent = sum(key not in bloom for _, keys in index.key_batches() for key in keys)
    return [f"{path.name}: {absent} keys are not in the filter"] if absent else []


def keys_and_offsets(index: Index) -> Iterator[tuple[int, list[str], np.ndarray]]:
    """The keys a batch at a time, each with its ``len(keys) + 1`` offsets (start of each,
    then the end of the last)."""
    for first, keys in index.key_batches(4096):
        keys = keys[:max(0, index.offset_count - 1 - first)]  # no more than the offsets tell
        if not keys:
            return
        yield first, keys, index.offsets(first, first + len(keys) + 1)

