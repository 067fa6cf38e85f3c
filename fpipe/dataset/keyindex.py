"""The keys of a packed dataset: how they are hashed (the salted 64-bit hashes of
``.key_hashes``, with datadings's search for a salt under which they are distinct), the Bloom
filter of ``.filter`` (simplebloom's format), and how they are looked up.

One protocol looks keys up, :class:`KeyLookup` (``len``, ``lookup[i]``, :meth:`~KeyLookup.keys`
of a range, :meth:`~KeyLookup.find` a key's index), with two kinds of table behind it:
:class:`KeyIndex`, the key index file ``X.msgpack.key_index`` read with a few ``pread`` calls
and no table in memory, and :class:`KeyTable`, the keys in memory (read from ``.keys``, a
legacy ``.index``, or a foreign format's index) with their hashes sorted for lookups. The
readers of :mod:`fpipe.dataset` and :mod:`fpipe.formats` use these two and nothing else; a
:class:`~fpipe.dataset.reader.MsgpackReader` asks the key index where the dataset has one, and
a table made from ``.keys`` where it has none (or where the key index fails a check). The
public names of hashing and the filter are re-exported by :mod:`fpipe.dataset.format`.

>>> salt, hashes = hash_keys(["a", "b"])
>>> salt == key_salt(0), int(hashes[1]) == hash_key("b", salt)
(True, True)
>>> table = KeyTable.from_keys(["cat", "dog"])
>>> isinstance(table, KeyLookup), table.find("dog"), table[0], table.keys(0, 2)
(True, 1, 'cat', ['cat', 'dog'])

The key index
-------------

A reader without it looks keys up in a table of all the key hashes, sorted in memory (8 bytes a
sample, and a sort, in every process), and finds the key of an index in a table of all keys
(about 14 bytes a sample). At a billion samples those are gigabytes per process. The key index
holds the same sorted hashes on disk, with a directory by the top bits of the hash, so that a
lookup reads one directory entry and one bucket of about a hundred entries; and the place of
every key in ``.keys``, so that the key of an index is two reads. :class:`KeyIndex` reads it;
the writers write it with the dataset (see :mod:`fpipe.dataset.writer`), and
``fpipe index --keys`` adds it to a dataset that lacks it.

Layout (integers big-endian, like the rest of the format)::

    0    8 bytes  magic  b"FPKEYIDX"
    8    u32      version (2; version 1, without the checksums, is still read)
    12   u32      d: the directory's bits
    16   u64      n: samples
    24   8 bytes  the salt of the hashes (the .key_hashes salt)
    32   u64      the size of the .keys file it indexes
    40   16 bytes the MD5 of that .keys file
    56   u32      the CRC-32 of bytes 0 to 55 (version 1: zero)
    60   4 bytes  zero
    64   2**d + 1 u64: entry number where each directory slot begins (the last is n)
         n × (u64 hash, u64 index): the hashes sorted; slot j holds those whose top d bits are j
         n + 1 u64: where each key's msgpack string begins in .keys (the last is its size)
         2**d u32: the CRC-32 of each slot: of its two directory entries, then its entries
         ceil(n / 64) u32: the CRC-32 of each block of key places: places 64 b to 64 b + 64
                  (the last block ends at place n)

A lookup checks the checksums of what it reads (the header when the file is opened), so that a
flipped bit is an error rather than a wrong answer; the reader then leaves the file aside and
looks keys up in ``.keys`` (see :class:`~fpipe.dataset.reader.MsgpackReader`).

>>> import os, tempfile
>>> from fpipe.dataset import FileWriter
>>> from fpipe.dataset.format import DatasetFiles
>>> path = os.path.join(tempfile.mkdtemp(), "pets.msgpack")
>>> with FileWriter(path) as writer:
...     for key in ("cat", "dog", "ant"):
...         writer.write({"key": key})
>>> index = KeyIndex.open(DatasetFiles(path), 3)
>>> index.find("dog"), index.find("cow"), index[2], index.keys(0, 2)
(1, -1, 'ant', ['cat', 'dog'])
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np

from fpipe.errors import FormatError
from fpipe.files import DECODE_ERRORS, DatasetFiles, open_regular, read_md5

__all__ = ["BLOOM_MAX_BYTES", "BloomFilter", "KeyIndex", "KeyLookup", "KeyTable", "StaleKeyIndex",
           "digests", "hash_key", "hash_keys", "key_index_size", "key_salt", "read_key_table",
           "salted_hashes"]

_OFFSET = np.dtype(">u8")
_MASK64 = (1 << 64) - 1


# --- key hashing -----------------------------------------------------------------------------

def key_salt(attempt: int) -> bytes:
    """The salt datadings tries at ``attempt``: the first 8 bytes of blake2s of its decimal.

    >>> key_salt(0).hex()
    '652e530edee5893b'
    """
    return hashlib.blake2s(str(attempt).encode()).digest()[:8]


def hash_key(key: str, salt: bytes) -> int:
    """The 64-bit hash of ``key``: blake2s salted with ``salt``, first 8 bytes, big-endian.

    >>> hash_key("a", key_salt(0)) == hash_key("a", key_salt(0)) != hash_key("a", key_salt(1))
    True
    """
    return int.from_bytes(hashlib.blake2s(key.encode(), salt=salt).digest()[:8], "big")


def digests(keys: Iterable[str], salt: bytes = b"") -> bytes:
    """The 32-byte blake2s digests of the keys, concatenated.

    >>> len(digests(["a", "b"]))
    64
    """
    # Copying a prepared hash object is cheaper than passing the salt for every key.
    new = hashlib.blake2s(salt=salt).copy

    def digest(key: str) -> bytes:
        state = new()
        state.update(key.encode())
        return state.digest()
    return b"".join(map(digest, keys))


def salted_hashes(keys: Iterable[str], salt: bytes) -> np.ndarray:
    """:func:`hash_key` of each key, as a uint64 array (not in ``__all__``: the index
    writers use it).

    >>> int(salted_hashes(["a"], key_salt(0))[0]) == hash_key("a", key_salt(0))
    True
    """
    return np.frombuffer(digests(keys, salt), dtype=_OFFSET)[::4].astype(np.uint64)


def hash_keys(keys: Sequence[str], max_tries: int = 1000) -> tuple[bytes, np.ndarray]:
    """Hash every key with the first salt (in datadings's order) that gives distinct hashes.

    Returns ``(salt, hashes)``, the hashes as a uint64 array in key order.

    >>> salt, hashes = hash_keys(["a", "b"])
    >>> salt == key_salt(0), hashes.dtype, int(hashes[1]) == hash_key("b", salt)
    (True, dtype('uint64'), True)
    """
    message = f"key hashes collide for {max_tries} salts; are the keys unique?"
    for attempt in range(max_tries):
        salt = key_salt(attempt)
        hashes = salted_hashes(keys, salt)
        ranked = np.sort(hashes)
        if not (ranked[1:] == ranked[:-1]).any():
            return salt, hashes
        if not attempt:
            _refuse_duplicates(keys, hashes, message)
    raise RuntimeError(message)


def _refuse_duplicates(keys: Sequence[str], hashes: np.ndarray, message: str) -> None:
    """Duplicate keys collide under every salt: say so at once, rather than after hashing
    every key with each of them."""
    order = np.argsort(hashes, kind="stable")
    ranked = hashes[order]
    for at in np.flatnonzero(ranked[1:] == ranked[:-1]).tolist():
        if keys[order[at]] == keys[order[at + 1]]:
            raise RuntimeError(f"{message} ({keys[order[at]]!r} is there twice)")


# --- the Bloom filter (simplebloom's file format) --------------------------------------------

_BLOOM_MAGIC = b"SIMPBLOO"
_BLOOM_HEADER = struct.Struct(">8sQQd")
_LN2 = 0.6931471805599453
_LN2_SQUARED = 0.4804530139182015
_BLOOM_BATCH = 1 << 15
_BLOOM_UNPACKED_MAX = 8 << 20
#: The most bytes of bits a Bloom filter that fpipe writes takes (see
#: :meth:`BloomFilter.for_count`): a writer holds it while it writes the index.
BLOOM_MAX_BYTES = 64 << 20


class BloomFilter:
    """A Bloom filter of strings, stored byte for byte as simplebloom stores it.

    Sized for ``num_elements`` with false-positive probability ``false_positive_prob``
    (default ``1 / num_elements``). Key ``k`` sets bits ``(h1 + i * h2) mod 2**64 mod
    num_bits`` for ``i < num_hashes``, where ``h1, h2`` are the first two big-endian
    uint64 of blake2s of its UTF-8 bytes.

    >>> bloom = BloomFilter.build(["cat", "dog"])
    >>> "cat" in bloom, "cow" in bloom
    (True, False)
    >>> BloomFilter.loads(bloom.dumps()).dumps() == bloom.dumps()
    True
    """

    def __init__(self, num_elements: int, false_positive_prob: float | None = None,
                 bits: bytes | None = None) -> None:
        if num_elements < 2:
            raise ValueError(f"num_elements must be >= 2; got num_elements={num_elements}")
        fpp = 1.0 / num_elements if false_positive_prob is None else float(false_positive_prob)
        if not 0 < fpp < 1:
            raise ValueError(f"false_positive_prob must be in (0, 1); got {fpp}")
        self.num_elements, self.false_positive_prob = num_elements, fpp
        self.num_bits = _bloom_bits(num_elements, fpp)
        self.num_hashes = int(round(self.num_bits / num_elements * _LN2))
        size = self.num_bits >> 3
        if bits is not None and len(bits) != size:
            raise ValueError(f"a filter of {num_elements} elements has {size} bytes; got {len(bits)}")
        self._bits = bytearray(size) if bits is None else bytearray(bits)
        self._unpacked: np.ndarray | None = None

    @classmethod
    def build(cls, keys: Sequence[str]) -> BloomFilter:
        """The filter fpipe writes for ``keys`` (:meth:`for_count` of their number).

        >>> "b" in BloomFilter.build(["a", "b"])
        True
        """
        bloom = cls.for_count(len(keys))
        bloom.update(keys)
        return bloom

    @classmethod
    def for_count(cls, n: int) -> BloomFilter:
        """An empty filter for ``n`` keys: datadings's, of ``max(2, n)`` elements at false
        positives ``1 / max(2, n)``, while it takes at most :data:`BLOOM_MAX_BYTES`; past
        about 14 million keys, one of that many bytes, with more false positives (its header
        says which; ``key in reader`` then looks the key up, so answers stay right).

        >>> BloomFilter.for_count(1000).num_bits == BloomFilter(1000).num_bits
        True
        >>> BloomFilter.for_count(10**9).num_bits // 8 <= BLOOM_MAX_BYTES
        True
        """
        elements = max(2, n)
        # sized before any is made: the filter of 1 / n false positives at 100M keys is 480 MB
        if _bloom_bits(elements, 1.0 / elements) // 8 <= BLOOM_MAX_BYTES:
            return cls(elements)
        # a byte short of the bound, so that rounding up stays within it
        return cls(elements, math.exp(-8 * (BLOOM_MAX_BYTES - 1) * _LN2_SQUARED / elements))

    def update(self, keys: Sequence[str]) -> None:
        """Add every key (vectorised over batches of keys). A filter of up to 8 MiB keeps its
        bits unpacked meanwhile, eight times its size, until it is read or dumped; a larger one
        sets them in place."""
        data = np.frombuffer(self._bits, np.uint8)
        if self._unpacked is None and len(data) <= _BLOOM_UNPACKED_MAX:
            self._unpacked = np.unpackbits(data, bitorder="little").view(bool)
        rounds = np.arange(self.num_hashes, dtype=np.uint64)
        for start in range(0, len(keys), _BLOOM_BATCH):
            h1, h2 = _bloom_hashes(keys[start:start + _BLOOM_BATCH])
            with np.errstate(over="ignore"):
                positions = ((h1[:, None] + rounds[None, :] * h2[:, None])
                             % np.uint64(self.num_bits)).ravel()
            if self._unpacked is not None:
                self._unpacked[positions] = True
            else:
                np.bitwise_or.at(data, (positions >> np.uint64(3)).astype(np.intp),
                                 np.left_shift(1, positions & np.uint64(7)).astype(np.uint8))

    def _packed(self) -> bytearray:
        if self._unpacked is not None:
            self._bits = bytearray(np.packbits(self._unpacked, bitorder="little").tobytes())
            self._unpacked = None
        return self._bits

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            data = key.encode()
        except UnicodeEncodeError:  # a lone surrogate: no key that UTF-8 can hold was added
            return False
        h1, h2 = struct.unpack_from(">QQ", hashlib.blake2s(data).digest())
        bits, num_bits = self._packed(), self.num_bits
        for i in range(self.num_hashes):
            position = ((h1 + i * h2) & _MASK64) % num_bits
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
        return True

    def dumps(self) -> bytes:
        """The filter file: ``>8sQQd`` header (magic, total size, elements, fpp) and the bits."""
        bits = self._packed()
        header = _BLOOM_HEADER.pack(_BLOOM_MAGIC, _BLOOM_HEADER.size + len(bits),
                                    self.num_elements, self.false_positive_prob)
        return header + bytes(bits)

    def dump(self, path: Path) -> str:
        """Write the filter file (:meth:`dumps`) to ``path`` without a copy of its bits in
        memory; its MD5.

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "x.filter"
        >>> bloom = BloomFilter.build(["a"])
        >>> bloom.dump(path) == hashlib.md5(bloom.dumps()).hexdigest(), path.read_bytes() == bloom.dumps()
        (True, True)
        """
        bits = self._packed()
        header = _BLOOM_HEADER.pack(_BLOOM_MAGIC, _BLOOM_HEADER.size + len(bits),
                                    self.num_elements, self.false_positive_prob)
        with open(path, "wb") as file:
            file.write(header)
            file.write(bits)
        md5 = hashlib.md5(header)
        md5.update(bits)
        return md5.hexdigest()

    @classmethod
    def loads(cls, data: bytes) -> BloomFilter:
        """Read a filter from the bytes of a ``.filter`` file."""
        if len(data) < _BLOOM_HEADER.size:
            raise ValueError(f"a Bloom filter has a {_BLOOM_HEADER.size}-byte header; got {len(data)} bytes")
        magic, size, num_elements, fpp = _BLOOM_HEADER.unpack_from(data)
        if magic != _BLOOM_MAGIC or size != len(data):
            raise ValueError("not a simplebloom filter (bad magic or size)")
        return cls(num_elements, fpp, data[_BLOOM_HEADER.size:])


def _bloom_bits(num_elements: int, fpp: float) -> int:
    """The bits of a filter of ``num_elements`` at false positives ``fpp``: the same float
    arithmetic as simplebloom, so that sizes agree to the bit."""
    return int(math.ceil(num_elements * math.log(fpp) / -_LN2_SQUARED / 8) * 8)


def _bloom_hashes(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    words = np.frombuffer(digests(keys), dtype=_OFFSET).reshape(-1, 4).astype(np.uint64)
    return words[:, 0], words[:, 1]


# --- looking keys up -------------------------------------------------------------------------

@runtime_checkable
class KeyLookup(Protocol):
    """What looks the keys of ``n`` samples up: ``len``, ``lookup[i]`` the key of sample ``i``
    (``0 <= i < n``), :meth:`keys` of samples ``start`` to ``stop``, and :meth:`find` the
    index of a key (-1 for one that is not there, or that is not a str). :class:`KeyIndex`
    (on disk) and :class:`KeyTable` (in memory) are the two kinds; a reader holds one, or
    chooses between them (:class:`~fpipe.dataset.reader.DatasetKeys`)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def keys(self, start: int, stop: int) -> list[str]: ...

    def find(self, key: Any) -> int: ...


_KEY_BATCH = 1 << 16


class KeyTable:
    """Keys in memory: one bytes object of their UTF-8 (a str with lone surrogates from a
    non-UTF-8 name keeps its bytes) and an array of where each ends, with their 64-bit hashes
    sorted for :meth:`find`, made at the first lookup. No Python object per key, so forked
    workers do not copy them. A :class:`KeyLookup`.

    By default the hashes are made from the keys, salted with ``key_salt(0)``, and a lookup
    compares the key it finds: keys may repeat, and a key is found at its first place.
    ``hashes`` is instead a function that gives ``(salt, hashes)`` under which the keys'
    hashes are distinct (a dataset's ``.key_hashes``): then a lookup needs the hashes alone,
    and never loads the keys. ``load``, a function that gives a :class:`KeyTable`, defers
    reading the keys to their first use.

    >>> table = KeyTable.from_keys(["b", "a", "b"])
    >>> len(table), table[2], table.find("b"), table.find("z"), table.find(3), table.keys(0, 2)
    (3, 'b', 0, -1, -1, ['b', 'a'])
    >>> KeyTable(*KeyTable.from_keys(["x"]).arrays()).find("x")
    0
    """

    __slots__ = ("_blob", "_ends", "_hashes", "_load", "_order", "_salt", "_sorted")

    def __init__(self, blob: Any = None, ends: Any = None, *,
                 load: Callable[[], KeyTable] | None = None,
                 hashes: Callable[[], tuple[bytes, np.ndarray]] | None = None) -> None:
        self._blob: bytes | None = None
        self._ends: memoryview | None = None
        if blob is not None:
            self._blob = blob if isinstance(blob, bytes) else np.asarray(blob, np.uint8).tobytes()
            ends = np.concatenate([np.zeros(1, np.int64), np.asarray(ends, np.int64)])
            # a memoryview: indexing it gives Python ints, several times faster than NumPy's
            self._ends = memoryview(ends.astype(np.uint32 if len(self._blob) < 2**32 else np.int64))
        self._load, self._hashes = load, hashes
        self._salt: bytes = key_salt(0)
        self._order: np.ndarray | None = None
        self._sorted: np.ndarray | None = None

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> KeyTable:
        """The table of ``keys``."""
        encoded = [key.encode("utf-8", "surrogateescape") for key in keys]
        return cls(b"".join(encoded), np.cumsum(np.fromiter(map(len, encoded), np.int64,
                                                            len(encoded))))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys as a uint8 array of their UTF-8 and the end of each, as :class:`KeyTable`
        takes them."""
        blob, ends = self._keys()
        return np.frombuffer(blob, np.uint8), np.asarray(ends, np.int64)[1:]

    def __reduce__(self) -> tuple:
        return KeyTable, self.arrays()

    def _keys(self) -> tuple[bytes, memoryview]:
        if self._blob is None:
            loaded = self._load()
            self._blob, self._ends = loaded._keys()
        return self._blob, self._ends

    def __len__(self) -> int:
        return len(self._keys()[1]) - 1

    def __getitem__(self, index: int) -> str:
        blob, ends = self._keys()
        return blob[ends[index]:ends[index + 1]].decode("utf-8", "surrogateescape")

    def keys(self, start: int, stop: int) -> list[str]:
        blob, ends = self._keys()
        return [blob[ends[i]:ends[i + 1]].decode("utf-8", "surrogateescape")
                for i in range(start, stop)]

    @property
    def hashed(self) -> bool:
        """Whether the sorted hashes are made (a lookup then costs a binary search)."""
        return self._sorted is not None

    def find(self, key: Any) -> int:
        """The index of ``key`` (its first, if the keys repeat), or -1."""
        if not isinstance(key, str):
            return -1
        if self._sorted is None:
            self._sort()
        try:
            value = np.uint64(_hash64(key.encode("utf-8", "surrogateescape"), self._salt))
        except UnicodeEncodeError:  # no key that UTF-8 or a file name can hold
            return -1
        slot = int(np.searchsorted(self._sorted, value))
        if self._hashes is not None:  # distinct hashes: the hash is the key
            return int(self._order[slot]) if slot < len(self._sorted) and \
                self._sorted[slot] == value else -1
        while slot < len(self._sorted) and self._sorted[slot] == value:
            index = int(self._order[slot])
            if self[index] == key:
                return index
            slot += 1
        return -1

    def _sort(self) -> None:
        if self._hashes is not None:
            self._salt, hashes = self._hashes()
        else:
            blob, ends = self._keys()
            new = hashlib.blake2s(salt=self._salt).copy

            def digest(a: int, b: int) -> bytes:
                state = new()
                state.update(blob[a:b])
                return state.digest()[:8]
            hashes = np.frombuffer(b"".join(digest(ends[i], ends[i + 1])
                                            for i in range(len(ends) - 1)),
                                   dtype=">u8").astype(np.uint64)
        order = np.argsort(hashes, kind="stable")
        self._order, self._sorted = order, hashes[order]


def _hash64(data: bytes, salt: bytes) -> int:
    return int.from_bytes(hashlib.blake2s(data, salt=salt).digest()[:8], "big")


def read_key_table(path: Path, expected: int) -> KeyTable:
    """The keys of a ``.keys`` file, which must hold ``expected`` of them, as a table;
    :class:`~fpipe.errors.FormatError` naming the file otherwise."""
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
    return KeyTable(b"".join(pieces), np.cumsum(np.concatenate([np.zeros(0, np.int64), *lengths])))


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


# --- the key index file ----------------------------------------------------------------------

MAGIC = b"FPKEYIDX"
VERSION = 2  # version 1 has no checksums
HEADER = struct.Struct(">8sIIQ8sQ16sI4x")
_SUMMED = 56  # the header's bytes that its checksum covers
_PAIR = struct.Struct(">QQ")
_BLOCK = 64  # key places per checksum
_SUM_SLOTS = 4096  # directory slots summed at once when the index is written
_BUCKET = 128  # entries a directory slot holds on average, at most
_MAX_BITS = 40
_SORTED = 16 << 20  # bytes of (hash, index) pairs sorted at once when the index is written
_PENDING = 32 << 20  # bytes of pairs held before they go to the spill file


def directory_bits(n: int) -> int:
    """The bits of the directory of a key index of ``n`` samples: slots of fewer than 128
    entries on average.

    >>> directory_bits(100), directory_bits(10**8)
    (0, 20)
    """
    return min(_MAX_BITS, (n // _BUCKET).bit_length())


def key_index_size(n: int, version: int = VERSION) -> int:
    """The size in bytes of the key index of ``n`` samples (24 bytes a sample and a little).

    >>> key_index_size(0), key_index_size(1000), key_index_size(1000, version=1)
    (92, 24240, 24144)
    """
    slots = 1 << directory_bits(n)
    size = HEADER.size + 8 * (slots + 1) + 16 * n + 8 * (n + 1)
    return size + 4 * (slots + _blocks(n)) if version > 1 else size


def _blocks(n: int) -> int:
    """The blocks of key places that have a checksum each."""
    return -(-n // _BLOCK)


def _sections(n: int, bits: int) -> tuple[int, int, int, int]:
    """Where the entries, the key places, the slots' checksums and the blocks' begin."""
    entries = HEADER.size + 8 * ((1 << bits) + 1)
    places = entries + 16 * n
    slot_sums = places + 8 * (n + 1)
    return entries, places, slot_sums, slot_sums + 4 * (1 << bits)


def _slot_sum(directory: bytes, bucket: bytes) -> int:
    """The checksum of a slot: of its two directory entries, then its entries."""
    return zlib.crc32(bucket, zlib.crc32(directory))


class StaleKeyIndex(FormatError):
    """A key index built for other keys than the dataset's ``.keys`` holds (the dataset was
    rewritten by a program that knows no key index, such as datadings, which rewrote its
    ``.key_hashes`` too)."""


class KeyIndex:
    """An open key index of a dataset of ``n`` samples, a :class:`KeyLookup`: :meth:`find` a
    key's index, ``index[i]`` the key of sample ``i``, :meth:`keys` of a range. Reads with
    ``pread``, so it is thread- and fork-safe; it holds two open files and the header.

    :meth:`open` checks the header (its checksum, and that it describes a file of this size
    for the dataset's ``n`` samples and ``.keys``); each lookup checks the checksums of the
    directory slot and the blocks of key places it reads (a version 1 file has none: then the
    ends of the bucket, in its slot and in order), that every place lies in ``.keys``, and the
    key of the sample it names. A check that fails raises :class:`~fpipe.errors.FormatError`
    naming the file, before anything is allocated from what it claims; the reader then leaves
    the key index aside and looks keys up in ``.keys``. ``fpipe verify`` checks the whole file
    against the dataset's ``.md5``.
    """

    __slots__ = ("_blocks", "_entries", "_fd", "_keys_fd", "_keys_size", "_places", "_slots",
                 "bits", "keys_path", "n", "path", "salt", "version", "__weakref__")

    def __init__(self, files: DatasetFiles, n: int, header: tuple) -> None:
        self.path, self.keys_path, self.n = files.key_index, files.keys, n
        _, self.version, self.bits, _, self.salt, self._keys_size = header[:6]
        self._entries, self._places, self._slots, self._blocks = _sections(n, self.bits)
        self._fd = self._keys_fd = None
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._keys_fd = os.open(self.keys_path, os.O_RDONLY | getattr(os, "O_BINARY", 0))

    def __del__(self, _close=os.close) -> None:
        for fd in (self._fd, self._keys_fd):
            if fd is not None:
                _close(fd)

    @classmethod
    def open(cls, files: DatasetFiles, n: int) -> KeyIndex | None:
        """The key index of the dataset of ``files`` (of ``n`` samples), or None if it has
        none; :class:`~fpipe.errors.FormatError` naming it if it fails its header's checks, or
        :class:`StaleKeyIndex` if it was built for other keys."""
        try:
            with open(files.key_index, "rb") as file:
                head, size = file.read(HEADER.size), os.fstat(file.fileno()).st_size
        except FileNotFoundError:
            return None
        header = _checked_header(files.key_index, head, size, n)
        stale = _stale(files, header)
        if stale:
            raise StaleKeyIndex(stale, path=files.key_index)
        return cls(files, n, header)

    def __len__(self) -> int:
        return self.n

    def find(self, key: Any) -> int:
        """The index of ``key``, or -1 (also for a str that UTF-8 cannot encode, and for
        anything but a str)."""
        if not isinstance(key, str):
            return -1
        try:
            value = hash_key(key, self.salt)
        except UnicodeEncodeError:
            return -1
        bucket = self._bucket(value >> (64 - self.bits) if self.bits else 0)
        wanted = value.to_bytes(8, "big")
        at = _first_not_below(bucket, wanted)
        if bucket[at:at + 8] != wanted:
            return -1
        index = int.from_bytes(bucket[at + 8:at + 16], "big")
        if index >= self.n or self[index] != key:
            raise FormatError(f"the key index names sample {index} for key {key!r:.80}, which "
                              "does not have it", path=self.path)
        return index

    def _bucket(self, slot: int) -> bytes:
        """The entries of directory slot ``slot``, checked."""
        directory = self._read(self._fd, HEADER.size + 8 * slot, 16, self.path)
        begin, end = _PAIR.unpack(directory)
        if not begin <= end <= self.n:
            raise FormatError(f"directory slot {slot} spans entries {begin} to {end} of "
                              f"{self.n}", path=self.path)
        bucket = self._read(self._fd, self._entries + 16 * begin, 16 * (end - begin), self.path)
        if self.version > 1:
            self._check(self._slots + 4 * slot, _slot_sum(directory, bucket),
                        f"directory slot {slot}")
        if bucket and not self._in_slot(bucket, slot):
            raise FormatError(f"directory slot {slot} holds hashes that are not its own, in "
                              "order", path=self.path)
        return bucket

    def _in_slot(self, bucket: bytes, slot: int) -> bool:
        """Whether the first and last hashes of ``bucket`` are in order and in ``slot``."""
        shift = 64 - self.bits
        first, last = int.from_bytes(bucket[:8], "big"), int.from_bytes(bucket[-16:-8], "big")
        return first <= last and first >> shift == last >> shift == slot if self.bits else first <= last

    def __getitem__(self, index: int) -> str:
        """The key of sample ``index`` (``0 <= index < n``)."""
        start, stop = self._span(index, index + 1)
        data = self._read(self._keys_fd, start, stop - start, self.keys_path)
        try:
            key = msgpack.unpackb(data, raw=False)
        except DECODE_ERRORS as error:
            raise self._not_keys(f" ({error})") from error
        if type(key) is not str:
            raise self._not_keys("")
        return key

    def keys(self, start: int, stop: int) -> list[str]:
        """The keys of samples ``start`` to ``stop`` (a range of the dataset), read at once."""
        if start >= stop:
            return []
        first, last = self._span(start, stop)
        return self._decoded(self._read(self._keys_fd, first, last - first, self.keys_path),
                             stop - start)

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        """Where the keys of samples ``start`` to ``stop`` (``start < stop <= n``) lie in
        ``.keys``: key places ``start`` and ``stop``, checked, and within ``.keys``."""
        first_place, places = self._places_around(start, stop)
        first, last = (int.from_bytes(places[8 * (at - first_place):8 * (at - first_place + 1)],
                                      "big") for at in (start, stop))
        if not first <= last <= self._keys_size:
            raise FormatError(f"the keys of samples {start} to {stop} are said to lie at bytes "
                              f"{first} to {last} of {self.keys_path.name}, which has "
                              f"{self._keys_size}", path=self.path)
        return first, last

    def _places_around(self, start: int, stop: int) -> tuple[int, bytes]:
        """The blocks of key places that hold places ``start`` to ``stop``, checked against
        their checksums (version 2), and the number of the first place they hold."""
        low, high = start // _BLOCK, (stop - 1) // _BLOCK
        first_place = low * _BLOCK
        places = self._read(self._fd, self._places + 8 * first_place,
                            8 * (min((high + 1) * _BLOCK, self.n) - first_place + 1), self.path)
        if self.version > 1:
            sums = self._read(self._fd, self._blocks + 4 * low, 4 * (high - low + 1), self.path)
            for block in range(high - low + 1):
                at = 8 * _BLOCK * block
                if zlib.crc32(places[at:at + 8 * (_BLOCK + 1)]) != \
                        int.from_bytes(sums[4 * block:4 * block + 4], "big"):
                    raise FormatError(f"the places of keys {(low + block) * _BLOCK} to "
                                      f"{(low + block + 1) * _BLOCK} fail their checksum",
                                      path=self.path)
        return first_place, places

    def _check(self, offset: int, computed: int, what: str) -> None:
        """Raise if the checksum at ``offset`` is not ``computed``, the sum of ``what``."""
        if int.from_bytes(self._read(self._fd, offset, 4, self.path), "big") != computed:
            raise FormatError(f"{what} fails its checksum", path=self.path)

    def _read(self, fd: int, offset: int, size: int, path: Path) -> bytes:
        if size < 0:
            raise FormatError(f"a span of {size} bytes at byte {offset}", path=path)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise FormatError(f"the file ends before byte {offset + size}", path=path)
        return data

    def _decoded(self, data: bytes, count: int) -> list[str]:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(1, len(data)))
        unpacker.feed(data)
        try:
            keys = [unpacker.unpack() for _ in range(count)]
        except (msgpack.OutOfData, *DECODE_ERRORS) as error:
            raise self._not_keys(f" ({error})") from error
        if unpacker.tell() != len(data) or not all(type(key) is str for key in keys):
            raise self._not_keys("")
        return keys

    def _not_keys(self, detail: str) -> FormatError:
        # the keys file is named: the bytes there are what do not decode
        return FormatError(f"the bytes that {self.path.name} points at are not keys{detail}",
                           path=self.keys_path)


def _first_not_below(bucket: bytes, wanted: bytes) -> int:
    """The byte offset in ``bucket`` of its first (hash, index) entry whose hash is not below
    ``wanted``, or its length (big-endian hashes compare as bytes as they do as numbers)."""
    low, high = 0, len(bucket) // 16
    while low < high:
        middle = (low + high) // 2
        if bucket[16 * middle:16 * middle + 8] < wanted:
            low = middle + 1
        else:
            high = middle
    return 16 * low


def _checked_header(path: Path, head: bytes, size: int, n: int) -> tuple:
    if len(head) < HEADER.size:
        raise FormatError(f"a key index begins with a {HEADER.size}-byte header; the file has "
                          f"{len(head)} bytes", path=path)
    header = HEADER.unpack(head)
    magic, version, bits, count = header[:4]
    if magic != MAGIC:
        raise FormatError(f"not a key index (it begins {magic!r})", path=path)
    if version not in (1, VERSION):
        raise FormatError(f"a key index of version {version}; this fpipe reads versions 1 and "
                          f"{VERSION}", path=path)
    if version > 1 and header[7] != zlib.crc32(head[:_SUMMED]):
        raise FormatError("the header fails its checksum", path=path)
    if count != n or bits != directory_bits(n) or size != key_index_size(n, version):
        raise FormatError(f"a key index of {count} samples in {size} bytes, for a dataset of "
                          f"{n} (which takes {key_index_size(n, version)} bytes)", path=path)
    return header


def _stale(files: DatasetFiles, header: tuple) -> str | None:
    """Why the key index is not of the dataset's ``.keys`` file, or None."""
    keys_size, keys_md5 = header[5], header[6].hex()
    try:
        size = files.keys.stat().st_size
    except FileNotFoundError:
        return "the dataset has no .keys file"
    listed = read_md5(files.data).get(files.keys.name) if files.md5.exists() else None
    if size != keys_size or (listed is not None and listed != keys_md5):
        return "it indexes other keys than the dataset's .keys file holds"
    return None


# --- writing ---------------------------------------------------------------------------------

class SortedPairs:
    """``(hash, index)`` pairs sorted by hash in bounded memory: partitioned by the top bits of
    the hash as they come (held in memory up to 32 MiB, then appended to a spill file in
    ``folder``), then each partition sorted on its own (about 16 MiB each).

    >>> import tempfile
    >>> pairs = SortedPairs(4, Path(tempfile.mkdtemp()))
    >>> pairs.add(np.array([9, 3, 7, 1], dtype=np.uint64), 0)
    >>> [part.tolist() for part in pairs.sorted()]
    [[[1, 3], [3, 1], [7, 2], [9, 0]]]
    """

    def __init__(self, n: int, folder: Path) -> None:
        self.bits = min(directory_bits(n), max(0, (16 * n // _SORTED).bit_length()))
        self._pending: list[list[np.ndarray]] = [[] for _ in range(1 << self.bits)]
        self._runs: list[list[tuple[int, int]]] = [[] for _ in range(1 << self.bits)]
        self._held = 0
        self._spill = tempfile.TemporaryFile(dir=folder)

    def add(self, hashes: np.ndarray, first: int) -> None:
        """The pairs of ``hashes`` (uint64) and the indices from ``first`` on."""
        pairs = np.empty((len(hashes), 2), dtype=np.uint64)
        pairs[:, 0], pairs[:, 1] = hashes, np.arange(first, first + len(hashes))
        if self.bits:
            part = (hashes >> np.uint64(64 - self.bits)).astype(np.intp)
            order = np.argsort(part, kind="stable")
            pairs, counts = pairs[order], np.bincount(part, minlength=1 << self.bits)
            for which, piece in enumerate(np.split(pairs, np.cumsum(counts)[:-1])):
                if len(piece):
                    self._pending[which].append(piece)
        else:
            self._pending[0].append(pairs)
        self._held += pairs.nbytes
        if self._held >= _PENDING:
            self._flush()

    def _flush(self) -> None:
        for which, pieces in enumerate(self._pending):
            if pieces:
                data = np.concatenate(pieces)
                self._runs[which].append((self._spill.tell(), len(data)))
                self._spill.write(data.tobytes())
                pieces.clear()
        self._held = 0

    def equal_hashes(self) -> list[list[int]]:
        """The indices of each run of pairs whose hashes are equal (two or more): the samples
        whose keys may be equal, found by :meth:`sorted` (so the pairs are gone after).

        >>> import tempfile
        >>> pairs = SortedPairs(4, Path(tempfile.mkdtemp()))
        >>> pairs.add(np.array([9, 3, 9, 3], dtype=np.uint64), 0)
        >>> pairs.equal_hashes()
        [[1, 3], [0, 2]]
        """
        groups = []
        for part in self.sorted():
            hashes = part[:, 0]
            bounds = [0, *(np.flatnonzero(hashes[1:] != hashes[:-1]) + 1).tolist(), len(hashes)]
            groups += [part[a:b, 1].tolist() for a, b in zip(bounds, bounds[1:]) if b - a > 1]
        return groups

    def sorted(self) -> Iterator[np.ndarray]:
        """The pairs, sorted by hash, a partition at a time (arrays of shape ``(k, 2)``)."""
        self._flush()
        self._spill.flush()
        try:
            for runs in self._runs:
                parts = [np.frombuffer(os.pread(self._spill.fileno(), 16 * count, offset),
                                       dtype=np.uint64).reshape(-1, 2) for offset, count in runs]
                if parts:
                    pairs = np.concatenate(parts)
                    yield pairs[np.argsort(pairs[:, 0], kind="stable")]
        finally:
            self._spill.close()


class KeyIndexWriter:
    """Writes the key index of ``n`` samples to ``path``: :meth:`add_key_offsets` in order as
    the keys are read, then :meth:`write_sorted` the sorted pairs, which returns the pairs of
    samples whose hashes are equal (none: the file is complete)."""

    def __init__(self, path: Path, n: int, salt: bytes, keys_size: int, keys_md5: str) -> None:
        self.path, self.n, self.bits = path, n, directory_bits(n)
        self._entries, self._key_offsets, self._slots, self._blocks = _sections(n, self.bits)
        self._file = open(path, "w+b")
        self._file.truncate(key_index_size(n))
        self._written = self._filled = 0
        self.header(salt, keys_size, keys_md5)

    def header(self, salt: bytes, keys_size: int, keys_md5: str) -> None:
        fields = (MAGIC, VERSION, self.bits, self.n, salt, keys_size, bytes.fromhex(keys_md5))
        summed = zlib.crc32(HEADER.pack(*fields, 0)[:_SUMMED])
        os.pwrite(self._file.fileno(), HEADER.pack(*fields, summed), 0)

    def add_key_offsets(self, offsets: np.ndarray) -> None:
        """The next key offsets (where keys begin in ``.keys``; the last call adds its size)."""
        _pwrite_all(self._file.fileno(), offsets.astype(">u8").tobytes(),
                    self._key_offsets + 8 * self._written)
        self._written += len(offsets)

    def write_sorted(self, parts: Iterator[np.ndarray]) -> list[tuple[int, int]]:
        """Write the entries and the directory from ``parts`` (the sorted pairs); return the
        index pairs whose hashes are equal."""
        # equal hashes share their top bits, so they meet in one part
        fd, done, equal, shift = self._file.fileno(), 0, [], np.uint64(64 - self.bits)
        for pairs in parts:
            _pwrite_all(fd, pairs.astype(">u8").tobytes(), self._entries + 16 * done)
            hashes = pairs[:, 0]
            same = np.flatnonzero(hashes[1:] == hashes[:-1])
            equal += [(int(pairs[i, 1]), int(pairs[i + 1, 1])) for i in same.tolist()]
            slots = hashes >> shift if self.bits else np.zeros(len(hashes), np.uint64)
            self._directory(slots, done)
            done += len(pairs)
        last = np.array([self.n], dtype=">u8").tobytes()
        os.pwrite(fd, last, HEADER.size + 8 * (1 << self.bits))
        return equal

    def _directory(self, slots: np.ndarray, done: int) -> None:
        """The directory entries of the slots from the first of ``slots`` (sorted) to the
        last: where each begins."""
        if not len(slots):
            return
        low, high = int(slots[0]), int(slots[-1])
        starts = done + np.searchsorted(slots, np.arange(low, high + 1, dtype=np.uint64))
        # slots before `low` that no earlier part reached begin where this part does
        gap = low - self._filled
        head = np.full(gap, done, dtype=np.uint64)
        entries = np.concatenate((head, starts.astype(np.uint64)))
        _pwrite_all(self._file.fileno(), entries.astype(">u8").tobytes(),
                    HEADER.size + 8 * (low - gap))
        self._filled = high + 1

    def close(self) -> str:
        """Finish the file (the directory's slots after the last hash, the checksums); its
        MD5."""
        tail = np.full((1 << self.bits) - self._filled, self.n, dtype=">u8")
        _pwrite_all(self._file.fileno(), tail.tobytes(), HEADER.size + 8 * self._filled)
        self._write_slot_sums()
        self._write_block_sums()
        self._file.flush()
        self._file.seek(0)
        md5 = hashlib.md5()
        while block := self._file.read(1 << 20):
            md5.update(block)
        self._file.close()
        return md5.hexdigest()

    def _write_slot_sums(self) -> None:
        """Write the checksums of the directory's slots, read back a few thousand slots at a
        time (about 128 entries each)."""
        fd, slots = self._file.fileno(), 1 << self.bits
        for low in range(0, slots, _SUM_SLOTS):
            count = min(_SUM_SLOTS, slots - low)
            directory = os.pread(fd, 8 * (count + 1), HEADER.size + 8 * low)
            starts = np.frombuffer(directory, dtype=">u8").tolist()
            entries = os.pread(fd, 16 * (starts[-1] - starts[0]), self._entries + 16 * starts[0])
            sums = [_slot_sum(directory[8 * j:8 * j + 16],
                              entries[16 * (starts[j] - starts[0]):16 * (starts[j + 1] - starts[0])])
                    for j in range(count)]
            _pwrite_all(fd, np.array(sums, dtype=">u4").tobytes(), self._slots + 4 * low)

    def _write_block_sums(self) -> None:
        """Write the checksums of the blocks of key places, read back 4,096 blocks at a
        time."""
        fd, step = self._file.fileno(), _SUM_SLOTS * _BLOCK
        for low in range(0, self.n, step):
            places = os.pread(fd, 8 * (min(step, self.n - low) + 1), self._key_offsets + 8 * low)
            sums = [zlib.crc32(places[at:at + 8 * (_BLOCK + 1)])
                    for at in range(0, len(places) - 8, 8 * _BLOCK)]
            _pwrite_all(fd, np.array(sums, dtype=">u4").tobytes(), self._blocks + 4 * (low // _BLOCK))

    def abandon(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
