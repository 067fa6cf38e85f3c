"""The key index ``X.msgpack.key_index``: keys to indices and back with a few ``pread`` calls,
no table in memory.

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
import os
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np

from fpipe.dataset._hashing import hash_key
from fpipe.errors import FormatError
from fpipe.files import DECODE_ERRORS, DatasetFiles, read_md5

__all__ = ["KeyIndex", "StaleKeyIndex", "key_index_size"]

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
    """An open key index of a dataset of ``n`` samples: :meth:`find` a key's index, ``index[i]``
    the key of sample ``i``, :meth:`keys` of a range. Reads with ``pread``, so it is thread- and
    fork-safe; it holds two open files and the header.

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

    def find(self, key: str) -> int:
        """The index of ``key``, or -1 (also for a str that UTF-8 cannot encode)."""
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
