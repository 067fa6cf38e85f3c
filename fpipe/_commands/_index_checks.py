"""The index checks of ``fpipe verify``, in bounded memory at any number of samples: offsets
are read a window at a time, keys a batch at a time, and repeated keys are found by sorting
their hashes by partitions in the temporary folder (16 bytes a sample there), comparing only
the keys whose hashes are equal.

>>> import tempfile, msgpack
>>> from fpipe.storage import write_index
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

import numpy as np

from ..errors import FormatError
from ..storage import BloomFilter, DatasetFiles, open_regular, read_legacy_index
from ..storage._hashing import key_salt, salted_hashes
from ..storage._indexing import array_length
from ..storage.keyindex import SortedPairs
from ._common import key_batches

__all__ = ["Index", "key_problems", "keys_and_offsets", "legacy_index", "offset_problems", "read_index"]

_WINDOW = 1 << 20  # offsets or hashes looked at a time
_BATCH = 1 << 16  # keys looked at a time


@dataclass
class Index:
    """A dataset's index as verify reads it: its ``count`` keys and ``offset_count`` offsets,
    read from its files as they are wanted (a legacy ``.index``'s are held: ``legacy``)."""

    files: DatasetFiles
    count: int
    offset_count: int
    legacy: tuple[list[str], np.ndarray] | None = None

    def offsets(self, low: int, high: int) -> np.ndarray:
        """Offsets ``low`` to ``high`` (not included), as int64."""
        if self.legacy is not None:
            return self.legacy[1][low:high]
        with open_regular(self.files.offsets) as file:
            data = os.pread(file.fileno(), 8 * (high - low), 8 * low)
        if len(data) != 8 * (high - low):
            raise FormatError(f"it ends before offset {high}", path=self.files.offsets)
        return np.frombuffer(data, dtype=">u8").astype(np.int64)

    def key_batches(self, size: int = _BATCH) -> Iterator[tuple[int, list[str]]]:
        """The keys in order, as ``(index of the first, keys)`` batches."""
        if self.legacy is None:
            yield from key_batches(self.files.keys, size)
            return
        keys = self.legacy[0]
        yield from ((first, keys[first:first + size]) for first in range(0, len(keys), size))


def read_index(files: DatasetFiles) -> Index:
    """The index of the dataset ``files`` (its ``.offsets`` and ``.keys``, or its legacy
    ``.index``); FileNotFoundError or FormatError if there is none to read."""
    if not files.offsets.exists():
        if files.legacy_index.exists():
            keys, offsets = read_legacy_index(files.data)
            return legacy_index(files, keys, offsets)
        raise FileNotFoundError(f"{files.offsets.name} is missing")
    if not files.keys.exists():
        raise FileNotFoundError(f"{files.keys.name} is missing")
    with open_regular(files.offsets) as file:
        size = os.fstat(file.fileno()).st_size
    if size % 8 or not size:
        raise FormatError(f"an offsets file holds n + 1 uint64; got {size} bytes",
                          path=files.offsets)
    return Index(files, array_length(files.keys), size // 8)


def legacy_index(files: DatasetFiles, keys: list[str], offsets: np.ndarray) -> Index:
    """The :class:`Index` of a legacy ``.index``'s keys and offsets."""
    return Index(files, len(keys), len(offsets), (keys, offsets.astype(np.int64)))


def offset_problems(index: Index, size: int) -> tuple[list[str], bool]:
    """The problems of the offsets against a data file of ``size`` bytes, and whether they
    are too broken to find the samples by."""
    n, problems = index.offset_count, []
    if n != index.count + 1:
        problems.append(f"index: {n - 1} offsets for {index.count} keys")
    first, end = int(index.offsets(0, 1)[0]), int(index.offsets(n - 1, n)[0])
    if first != 0:
        problems.append(f"index: the first sample starts at byte {first}, not 0")
    steps, where = _backward_steps(index)
    if steps:
        problems.append(f"index: sample {where[0]} at byte {where[1]} is empty or ends before "
                        f"it starts ({steps} such samples)")
    if end > size:
        problems.append(f"data file is truncated: the index ends at byte {end}, the file has "
                        f"{size} bytes")
    elif end < size:
        problems.append(f"data file has {size - end} bytes after its last sample (byte {end})")
    return problems, bool(first != 0 or steps or end > size)


def _backward_steps(index: Index) -> tuple[int, tuple[int, int]]:
    """How many samples are empty or end before they start, and the first's (index, start)."""
    count, first = 0, (0, 0)
    for low in range(0, index.offset_count - 1, _WINDOW):
        window = index.offsets(low, min(index.offset_count, low + _WINDOW + 1))
        steps = np.flatnonzero(np.diff(window) <= 0)
        if steps.size and not count:
            first = (low + int(steps[0]), int(window[steps[0]]))
        count += steps.size
    return count, first


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

