"""The key tables a reader holds in memory for a dataset without a key index (or at a URL):
the keys in one compact bytes object, and the key hashes sorted for binary search. Private:
:mod:`fpipe.dataset.reader` uses them (:mod:`fpipe.dataset.keyindex` does the same from disk).

>>> table = KeyTable.from_keys(["a", "bc"])
>>> len(table), table[1], table.keys(0, 2)
(2, 'bc', ['a', 'bc'])
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from pathlib import Path

import msgpack
import numpy as np

from fpipe.dataset.format import DECODE_ERRORS, hash_key, open_regular
from fpipe.errors import FormatError

__all__ = ["HashIndex", "KeyTable", "read_key_table"]

_KEY_BATCH = 1 << 16


class KeyTable:
    """Keys as one bytes object of concatenated UTF-8 plus a numpy array of end positions:
    compact, and no Python object per key (forked workers do not copy it on read)."""

    __slots__ = ("blob", "ends")

    def __init__(self, pieces: list[bytes], lengths: list[np.ndarray]) -> None:
        self.blob = b"".join(pieces)
        ends = np.cumsum(np.concatenate([np.zeros(1, np.int64), *lengths]))
        self.ends = memoryview(ends.astype(np.uint32 if len(self.blob) < 2**32 else np.int64))

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> KeyTable:
        encoded = [key.encode() for key in keys]
        return cls(encoded, [np.fromiter(map(len, encoded), np.int64, len(encoded))])

    def __len__(self) -> int:
        return len(self.ends) - 1

    def __getitem__(self, index: int) -> str:
        return self.blob[self.ends[index]:self.ends[index + 1]].decode()

    def keys(self, start: int, stop: int) -> list[str]:
        blob, ends = self.blob, self.ends
        return [blob[ends[i]:ends[i + 1]].decode() for i in range(start, stop)]


def read_key_table(path: Path, expected: int) -> KeyTable:
    with open_regular(path) as file:
        try:
            unpacker = msgpack.Unpacker(file, read_size=1 << 20)
            count = unpacker.read_array_header()
            if count == expected:
                pieces, lengths = _key_batches(unpacker, count)
        except (msgpack.OutOfData, *DECODE_ERRORS) as error:
            raise FormatError(f"corrupt keys file ({error})", path=path) from error
    if count != expected:
        raise FormatError(f"the keys file holds {count} keys for {expected} samples", path=path)
    return KeyTable(pieces, lengths)


def _key_batches(unpacker: msgpack.Unpacker, count: int) -> tuple[list, list]:
    pieces, lengths = [], []
    for first in range(0, count, _KEY_BATCH):
        wanted = min(_KEY_BATCH, count - first)
        batch = list(islice(unpacker, wanted))  # the iteration ends quietly at the file's end
        if len(batch) != wanted:
            raise ValueError(f"it ends after {first + len(batch)} of {count} keys")
        text = _joined_keys(batch, first)
        blob = text.encode()
        # UTF-8 lengths are the str lengths when every key is ASCII (one encode for all)
        sizes = map(len, batch) if len(blob) == len(text) else map(len, map(str.encode, batch))
        lengths.append(np.fromiter(sizes, np.int64, len(batch)))
        pieces.append(blob)
    return pieces, lengths


def _joined_keys(batch: list, first: int) -> str:
    try:
        return "".join(batch)
    except TypeError:  # msgpack bin comes back as bytes: keys are str
        at = next(i for i, key in enumerate(batch) if type(key) is not str)
        raise ValueError(f"key {first + at} is {batch[at]!r:.40}, not a str") from None


class HashIndex:
    """Key hashes sorted for binary search (no Python dict of hashes)."""

    __slots__ = ("order", "salt", "sorted")

    def __init__(self, salt: bytes, hashes: np.ndarray) -> None:
        self.salt = salt
        self.order = np.argsort(hashes, kind="stable")
        self.sorted = hashes[self.order]

    def find(self, key: str) -> int:
        """The index of ``key``, or -1 (also for a key with a lone surrogate, which UTF-8
        cannot encode, so no dataset holds it)."""
        try:
            value = np.uint64(hash_key(key, self.salt))
        except UnicodeEncodeError:
            return -1
        slot = int(np.searchsorted(self.sorted, value))
        if slot < len(self.sorted) and self.sorted[slot] == value:
            return int(self.order[slot])
        return -1
