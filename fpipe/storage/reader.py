"""Read packed datasets through the reader API (:class:`Reader`), which
:mod:`fpipe.storage.unpacked` also offers over lists, directories and zip files.

Every reader has ``len(r)``, ``key in r``, :meth:`~Reader.find_key`, :meth:`~Reader.find_index`,
:meth:`~Reader.get`, :meth:`~Reader.get_many`, :meth:`~Reader.get_slice`,
:meth:`~Reader.slice`, :meth:`~Reader.iter`, ``r[i]`` (negative ``i`` counts from the end)
and ``r[a:b:c]`` (a list, with Python's slice clamping, any step):

>>> import os, tempfile
>>> from fpipe.storage import FileWriter
>>> path = os.path.join(tempfile.mkdtemp(), "digits.msgpack")
>>> with FileWriter(path) as writer:
...     for i in range(10):
...         writer.write({"key": f"d{i}", "value": i})
>>> reader = MsgpackReader(path)
>>> len(reader), "d3" in reader, reader.find_index("d3"), reader.get(-1)
(10, True, 3, {'key': 'd9', 'value': 9})
>>> len(reader[2:8:2]), reader.get_many([7, 2]) == reader[7:1:-5]
(3, True)

:class:`MsgpackReader` is thread-safe and fork-safe: it reads with ``os.pread`` and ``mmap``,
never seek-then-read on a shared file, and it pickles by path (the child reopens the files).
Iterators are independent of each other.
"""

from __future__ import annotations

import abc
import errno
import glob
import mmap
import operator
import os
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Union

import msgpack
import numpy as np

from ..errors import FormatError, check_integer
from .format import (
    DECODE_ERRORS,
    BloomFilter,
    DatasetFiles,
    PathLike,
    hash_key,
    hash_keys,
    md5_file,
    read_key_hashes,
    read_legacy_index,
    read_md5,
)
from .format import decode_numpy as _decode_numpy

__all__ = [
    "MsgpackReader",
    "Reader",
    "ShardedReader",
]

_PAIR = struct.Struct(">QQ").unpack_from
_unpackb = msgpack.unpackb
# Chunks whose samples average at most this many bytes decode through one Unpacker (fewer
# calls); bigger samples decode one by one from the buffer (no extra copy into the Unpacker).
_UNPACKER_MAX_MEAN = 8192
_KEY_BATCH = 1 << 16
_COPY_BYTES = 1 << 16
# Sequential reads fetch offsets this many at a time, and data in blocks of about this size.
_OFFSETS_WINDOW = 4096
_READ_BYTES = 1 << 18


class Reader(abc.ABC):
    """The reader API; subclasses provide ``len``, ``in``, ``find_key``, ``find_index``, ``get``.

    Everything else is built on those (a subclass may override for speed). ``get_slice``
    returns a list, ``slice`` and ``iter`` return lazy iterators, and ``r[a:b:c]`` returns a
    list. ``seek``, ``next`` and ``rawnext`` keep datadings's cursor for old code: ``seek(k)``
    makes the next ``iter()`` without ``start`` begin at ``k`` (once; later passes start at 0).
    Iterators never move the cursor, so two iterators never interfere.

    >>> from fpipe.storage import ListReader
    >>> reader = ListReader([{"key": "a"}, {"key": "b"}, {"key": "c"}])
    >>> reader.seek(1)
    >>> [s["key"] for s in reader], [s["key"] for s in reader]
    (['b', 'c'], ['a', 'b', 'c'])
    """

    _position = 0

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of samples."""

    @abc.abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether a sample has ``key``."""

    @abc.abstractmethod
    def find_key(self, index: int) -> Any:
        """The key of sample ``index``."""

    @abc.abstractmethod
    def find_index(self, key: Any) -> int:
        """The index of the sample with ``key``; :class:`KeyError` if there is none."""

    @abc.abstractmethod
    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        """Sample ``index`` (negative counts from the end); ``(key, sample)`` with ``yield_key``.

        ``raw=True`` gives the packed msgpack bytes; ``copy=False`` lets a reader return raw
        bytes as a ``memoryview`` into its buffers instead of a copy.
        """

    def close(self) -> None:  # noqa: B027 (not abstract: a reader without files has none to release)
        """Release open files; the reader stays usable and reopens them when needed."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _index(self, index: Any) -> int:
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(f"indices must be integers; got {type(index).__name__} {index!r:.40}") from None
        n = len(self)
        if position < 0:
            position += n
        if not 0 <= position < n:
            raise IndexError(f"index {index} out of range for {n} samples")
        return position

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        """Samples ``start`` to ``stop`` (clamped like a Python slice), read at once, as a list."""
        start, stop, _ = slice(start, stop).indices(len(self))
        return [self.get(i, yield_key, raw, copy) for i in range(start, stop)]

    def get_many(self, indices: Iterable[int], yield_key: bool = False, raw: bool = False,
                 copy: bool = True) -> list:
        """Samples at ``indices`` (any order, repeats allowed), reading each run of
        consecutive indices with one :meth:`get_slice`.

        >>> from fpipe.storage import ListReader
        >>> ListReader([{"key": k} for k in "abcd"]).get_many([3, 0, 1, 3])
        [{'key': 'd'}, {'key': 'a'}, {'key': 'b'}, {'key': 'd'}]
        """
        positions = np.array([self._index(i) for i in indices], dtype=np.int64)
        if not positions.size:
            return []
        order = np.argsort(positions, kind="stable")
        ranked = positions[order]
        # A run breaks wherever the next index is not the successor (repeats too: each
        # repeat is decoded again, so no two results are the same object).
        breaks = (np.flatnonzero(np.diff(ranked) != 1) + 1).tolist()
        result: list = [None] * len(positions)
        for begin, end in zip([0, *breaks], [*breaks, len(positions)]):
            first = int(ranked[begin])
            samples = (self.get_slice(first, first + end - begin, yield_key, raw, copy)
                       if end - begin > 1 else [self.get(first, yield_key, raw, copy)])
            for slot, sample in zip(order[begin:end].tolist(), samples):
                result[slot] = sample
        return result

    def slice(self, start: int | None, stop: int | None = None, yield_key: bool = False,
              raw: bool = False, copy: bool = True) -> Iterator:
        """An iterator over samples ``start`` to ``stop`` (datadings's ``slice``)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        return self._chunks(start, stop, yield_key, raw, copy, max(1, stop - start))

    def iter(self, start: int | None = None, stop: int | None = None, yield_key: bool = False,
             raw: bool = False, copy: bool = True, chunk_size: int = 16) -> Iterator:
        """An independent iterator over samples ``start`` to ``stop`` (clamped like ``range``
        over a slice), reading ``chunk_size`` samples at a time.

        Without ``start`` it begins at the cursor set by :meth:`seek` (then resets the cursor).
        The output is the same for every ``chunk_size``.
        """
        chunk_size = check_integer("chunk_size", chunk_size, 1)
        if start is None:
            start = self._position if self._position < len(self) else 0
            self._position = 0
        start, stop, _ = slice(start, stop).indices(len(self))
        return self._chunks(start, stop, yield_key, raw, copy, chunk_size)

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for first in range(start, stop, chunk_size):
            yield from self.get_slice(first, min(stop, first + chunk_size), yield_key, raw, copy)

    def __iter__(self) -> Iterator:
        return self.iter()

    def rawiter(self, yield_key: bool = False) -> Iterator:
        """``iter(yield_key=yield_key, raw=True)``: the packed bytes of every sample."""
        return self.iter(yield_key=yield_key, raw=True)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self.get_slice(start, stop)
            return self.get_many(range(start, stop, step))
        return self.get(index)

    def seek_index(self, index: int) -> None:
        """Set the cursor used by :meth:`next` and by the next ``iter()`` without ``start``."""
        self._position = self._index(index)

    def seek(self, index: int) -> None:
        """Alias of :meth:`seek_index`."""
        self.seek_index(index)

    def seek_key(self, key: Any) -> None:
        """Set the cursor to the sample with ``key``."""
        self.seek_index(self.find_index(key))

    def next(self) -> Any:
        """The sample at the cursor, advancing it (:class:`StopIteration` at the end)."""
        return self._advance(raw=False)

    def __next__(self) -> Any:
        return self._advance(raw=False)

    def rawnext(self) -> bytes:
        """Like :meth:`next`, as packed bytes."""
        return self._advance(raw=True)

    def _advance(self, raw: bool) -> Any:
        if self._position >= len(self):
            raise StopIteration
        sample = self.get(self._position, raw=raw)
        self._position += 1
        return sample


class _Handle:
    """One process's open view of a dataset: the data file (``pread`` and ``mmap``) and its
    offsets (``mmap`` for random access, ``pread`` for sequential reads; or a legacy array).

    Readers and iterators hold a reference; the files close when the last one lets go, so
    closing a reader never pulls a file out from under a running iterator.
    """

    __slots__ = ("data", "fd", "map", "offsets", "offsets_fd", "size")

    def __init__(self, files: DatasetFiles, legacy_offsets: bytes | None) -> None:
        self.fd = self.offsets_fd = None
        self.fd = os.open(files.data, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self.size = os.fstat(self.fd).st_size
        self.map = _map(self.fd, self.size)
        self.data = memoryview(self.map)
        if legacy_offsets is None:
            self.offsets_fd = os.open(files.offsets, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            self.offsets = _map(self.offsets_fd, os.fstat(self.offsets_fd).st_size)
        else:
            self.offsets = legacy_offsets

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close is bound early: at interpreter exit the os module may already be gone.
        for fd in (self.fd, self.offsets_fd):
            if fd is not None:
                _close(fd)

    def offset_range(self, start: int, stop: int, path: Path) -> tuple[tuple[int, ...], int]:
        """Offsets ``start`` to ``stop`` inclusive, read with ``pread`` (no mapped pages), and
        how many of them from the first never decrease (all, unless the index is damaged)."""
        count = stop - start + 1
        if self.offsets_fd is None:
            data = self.offsets[8 * start:8 * (stop + 1)]
        else:
            data = os.pread(self.offsets_fd, 8 * count, 8 * start)
            if len(data) != 8 * count:
                raise FormatError("offsets file shrank while open", path=DatasetFiles(path).offsets)
        return struct.unpack(f">{count}Q", data), _increasing_run(data)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the data file (fewer at its end). Offsets past the end
        allocate nothing: ``pread`` makes a buffer of the size it is asked for."""
        wanted = min(stop, self.size) - start
        if wanted <= 0:
            return b""
        data = os.pread(self.fd, wanted, start)
        if len(data) == wanted or not data:
            return data
        parts, done = [data], len(data)  # one read returns at most about 2 GiB on Linux
        while done < wanted and (part := os.pread(self.fd, wanted - done, start + done)):
            parts.append(part)
            done += len(part)
        return b"".join(parts)


def _map(fd: int, size: int) -> mmap.mmap | bytes:
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""


class _KeyTable:
    """Keys as one bytes object of concatenated UTF-8 plus a numpy array of end positions:
    compact, and no Python object per key (forked workers do not copy it on read)."""

    __slots__ = ("blob", "ends")

    def __init__(self, pieces: list[bytes], lengths: list[np.ndarray]) -> None:
        self.blob = b"".join(pieces)
        ends = np.cumsum(np.concatenate([np.zeros(1, np.int64), *lengths]))
        self.ends = memoryview(ends.astype(np.uint32 if len(self.blob) < 2**32 else np.int64))

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> _KeyTable:
        encoded = [key.encode() for key in keys]
        return cls(encoded, [np.fromiter(map(len, encoded), np.int64, len(encoded))])

    def __len__(self) -> int:
        return len(self.ends) - 1

    def __getitem__(self, index: int) -> str:
        return self.blob[self.ends[index]:self.ends[index + 1]].decode()

    def keys(self, start: int, stop: int) -> list[str]:
        blob, ends = self.blob, self.ends
        return [blob[ends[i]:ends[i + 1]].decode() for i in range(start, stop)]


def _read_key_table(path: Path, expected: int) -> _KeyTable:
    try:
        with open(path, "rb") as file:
            unpacker = msgpack.Unpacker(file, raw=True, read_size=1 << 20)
            count = unpacker.read_array_header()
            if count == expected:
                pieces, lengths = _key_batches(unpacker, count)
    except (msgpack.OutOfData, *DECODE_ERRORS) as error:
        raise FormatError(f"corrupt keys file ({error})", path=path) from error
    if count != expected:
        raise FormatError(f"the keys file holds {count} keys for {expected} samples", path=path)
    return _KeyTable(pieces, lengths)


def _key_batches(unpacker: msgpack.Unpacker, count: int) -> tuple[list, list]:
    pieces, lengths = [], []
    for first in range(0, count, _KEY_BATCH):
        wanted = min(_KEY_BATCH, count - first)
        batch = list(islice(unpacker, wanted))  # the iteration ends quietly at the file's end
        if len(batch) != wanted:
            raise ValueError(f"it ends after {first + len(batch)} of {count} keys")
        b"\0".join(batch).decode()  # every key is UTF-8 (a NUL keeps them apart)
        lengths.append(np.fromiter(map(len, batch), np.int64, len(batch)))
        pieces.append(b"".join(batch))
    return pieces, lengths


class _HashIndex:
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


class MsgpackReader(Reader):
    """Read a packed dataset (datadings's format) by index, by key, or in order.

    Opening costs a few ``stat`` calls; offsets are memory-mapped, and keys, key hashes and
    the Bloom filter load on first use into numpy arrays (never Python lists). ``get`` reads
    through ``mmap``; ``iter`` reads ``chunk_size`` samples per ``os.pread`` (nothing is
    mapped, so forked workers iterating do not grow). ``buffering`` is accepted for datadings
    code and ignored. Keys are str: ``key in reader`` is False, and ``find_index(key)`` raises
    :class:`KeyError`, for anything else and for a str that UTF-8 cannot encode (one with a lone
    surrogate, such as a non-UTF-8 byte in a command-line argument).

    A missing ``.key_hashes`` is recomputed; a missing ``.filter`` leaves ``in`` working; a
    missing data file, or missing ``.offsets`` and legacy ``.index``, raises
    :class:`FileNotFoundError`. A truncated or corrupt sample raises
    :class:`~fpipe.errors.FormatError` (file, sample index, byte offset) when it is read.
    Decoded numpy arrays are read-only. Do not modify a dataset's files while a reader has
    them open (a mapped file that shrinks can crash the process with ``SIGBUS``).

    >>> import os, tempfile
    >>> from fpipe.storage import FileWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with FileWriter(path) as writer:
    ...     writer.write({"key": "a", "n": 1})
    ...     writer.write({"key": "b", "n": 2})
    >>> with MsgpackReader(path) as reader:
    ...     reader.get(1, yield_key=True), reader.get(0, raw=True)
    (('b', {'key': 'b', 'n': 2}), b'\\x82\\xa3key\\xa1a\\xa1n\\x01')
    """

    def __init__(self, path: PathLike, buffering: int = 0) -> None:
        self.path = Path(path)
        self._files = DatasetFiles(self.path)
        if not self.path.is_file():
            raise FileNotFoundError(errno.ENOENT, "dataset data file not found", str(self.path))
        self._legacy = not self._files.offsets.exists()
        self._len = self._legacy_length() if self._legacy else self._offsets_length()
        self._reset()

    def _reset(self) -> None:
        self._handle: _Handle | None = None
        self._legacy_index: tuple[_KeyTable, bytes] | None = None
        self._key_table: _KeyTable | None = None
        self._hash_index: _HashIndex | None = None
        self._bloom: BloomFilter | bool | None = None

    def _offsets_length(self) -> int:
        size = self._files.offsets.stat().st_size
        if size < 8 or size % 8:
            raise FormatError(f"an offsets file holds n + 1 uint64; got {size} bytes",
                              path=self._files.offsets)
        return size // 8 - 1

    def _legacy_length(self) -> int:
        index = self._files.legacy_index
        if not index.exists():
            raise FileNotFoundError(errno.ENOENT, "dataset index not found: need "
                                    f"{self._files.offsets.name} or {index.name}", str(self._files.offsets))
        with open(index, "rb") as file:
            try:
                return msgpack.Unpacker(file, read_size=16).read_map_header()
            except (msgpack.OutOfData, *DECODE_ERRORS) as error:
                raise FormatError(f"corrupt legacy index ({error})", path=index) from error

    def __getstate__(self) -> dict:
        return {"path": self.path, "_files": self._files, "_legacy": self._legacy, "_len": self._len}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return f"MsgpackReader({str(self.path)!r})"

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Let go of the open files (running iterators keep theirs); reopened when needed."""
        self._handle = None

    def _open(self) -> _Handle:
        legacy = self._legacy_tables()[1] if self._legacy else None
        handle = self._handle = _Handle(self._files, legacy)
        return handle

    def _legacy_tables(self) -> tuple[_KeyTable, bytes]:
        if self._legacy_index is None:
            keys, offsets = read_legacy_index(self.path)
            self._legacy_index = _KeyTable.from_keys(keys), offsets.astype(">u8").tobytes()
        return self._legacy_index

    def _keys(self) -> _KeyTable:
        table = self._key_table
        if table is None:
            if self._legacy:
                table = self._legacy_tables()[0]
            elif not self._files.keys.exists():
                raise FileNotFoundError(errno.ENOENT, "dataset keys file not found", str(self._files.keys))
            else:
                table = _read_key_table(self._files.keys, self._len)
            self._key_table = table
        return table

    def _hashes(self) -> _HashIndex:
        index = self._hash_index
        if index is None:
            if not self._legacy and self._files.key_hashes.exists():
                salt, hashes = read_key_hashes(self.path)
                if len(hashes) != self._len:
                    raise FormatError(f"{len(hashes)} key hashes for {self._len} samples",
                                      path=self._files.key_hashes)
            else:
                salt, hashes = self._recomputed_hashes()
            index = self._hash_index = _HashIndex(salt, hashes)
        return index

    def _recomputed_hashes(self) -> tuple[bytes, np.ndarray]:
        table = self._keys()
        try:
            return hash_keys(table.keys(0, len(table)))
        except RuntimeError as error:  # the same key twice
            keys = self._files.legacy_index if self._legacy else self._files.keys
            raise FormatError(f"corrupt keys ({error})", path=keys) from error

    def _filter(self) -> BloomFilter | None:
        if self._bloom is None:
            path = self._files.filter
            try:
                self._bloom = BloomFilter.loads(path.read_bytes())
            except FileNotFoundError:
                self._bloom = False
            except ValueError as error:
                raise FormatError(f"corrupt Bloom filter ({error})", path=path) from error
        return self._bloom or None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if self._hash_index is None:
            bloom = self._filter()
            if bloom is not None and key not in bloom:
                return False
        return self._hashes().find(key) >= 0

    def find_index(self, key: Any) -> int:
        """The index of ``key`` by its salted 64-bit hash (the keys file is not loaded)."""
        found = self._hashes().find(key) if isinstance(key, str) else -1
        if found < 0:
            raise KeyError(key)
        return found

    def find_key(self, index: int) -> str:
        """The key of sample ``index`` (loads the keys into a compact table once)."""
        return self._keys()[self._index(index)]

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        handle = self._handle or self._open()
        if type(index) is not int or not 0 <= index < self._len:
            index = self._index(index)
        start, stop = _PAIR(handle.offsets, index << 3)
        # Small samples are cheaper to copy out of the map than to wrap; big ones are not.
        data = handle.map[start:stop] if stop - start <= _COPY_BYTES else handle.data[start:stop]
        if not start <= stop <= handle.size:
            raise _span_error(self.path, index, start, stop, handle.size)
        if raw:
            sample = bytes(data) if copy else data
        else:
            try:
                sample = _unpackb(data, strict_map_key=False, object_hook=_decode_numpy)
            except DECODE_ERRORS as error:
                raise FormatError(f"corrupt sample ({error})", path=self.path, index=index,
                                  offset=start) from error
        if yield_key:
            return self._keys()[index], sample
        return sample

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        """Samples ``start`` to ``stop`` as a list, cut from one mapped byte range.

        The building block for chunked orderings: one contiguous read, then per-sample
        decoding (or raw per-sample ``bytes``/``memoryview`` with ``raw=True``).
        """
        start, stop, _ = slice(start, stop).indices(self._len)
        if start >= stop:
            return []
        handle = self._handle or self._open()
        offsets = struct.unpack_from(f">{stop - start + 1}Q", handle.offsets, 8 * start)
        # the largest offset, not the last: a damaged index may decrease, and then the error
        # names the sample where it does, not one whose bytes were left unread
        buffer = handle.data[offsets[0]:max(offsets)]
        samples = _split(buffer, offsets, start, raw, copy, self.path, handle.size)
        return list(zip(self._keys().keys(start, stop), samples) if yield_key else samples)

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        handle = self._handle or self._open()
        table = self._keys() if yield_key else None
        window = max(chunk_size, _OFFSETS_WINDOW)
        for first in range(start, stop, window):
            offsets, increasing = handle.offset_range(first, min(stop, first + window), self.path)
            # blocks span increasing offsets only: the samples before a decrease are read,
            # then the sample that ends before it starts raises
            for a, b in _reads(offsets[:increasing], chunk_size):
                samples = _split(handle.read(offsets[a], offsets[b]), offsets[a:b + 1], first + a,
                                 raw, copy, self.path, handle.size)
                if table is None:
                    yield from samples
                else:
                    yield from zip(table.keys(first + a, first + b), samples)
            if increasing < len(offsets):
                last = increasing - 1
                raise _span_error(self.path, first + last, offsets[last], offsets[increasing],
                                  handle.size)

    def verify_data(self, read_size: int = 512 * 1024, progress: bool = False) -> bool:
        """Whether the data file matches its ``.md5`` entry and ends where the last sample ends.

        Detects truncated, corrupted and extended data files. Reads the whole file.
        """
        expected = read_md5(self.path).get(self.path.name)
        if expected is None:
            raise FormatError(f"the md5 file has no entry for {self.path.name}", path=self._files.md5)
        handle = self._handle or self._open()
        last = _PAIR(handle.offsets, 8 * self._len - 8)[1] if self._len else 0
        return last == os.stat(self.path).st_size and md5_file(self.path, read_size, progress) == expected

    def verify_index(self, read_size: int = 512 * 1024) -> bool:
        """Whether every index file that ``.md5`` lists exists and matches its checksum."""
        entries = read_md5(self.path)
        listed = [path for path in self._files.index_files + (self._files.legacy_index,)
                  if path.name in entries]
        return all(path.exists() and md5_file(path, read_size) == entries[path.name] for path in listed)


def _increasing_run(data: bytes) -> int:
    """How many of the big-endian uint64 offsets in ``data`` never decrease from the first."""
    values = np.frombuffer(data, dtype=">u8")
    drops = np.flatnonzero(values[1:] < values[:-1])
    return int(drops[0]) + 1 if drops.size else len(values)


def _reads(offsets: Sequence[int], chunk_size: int) -> Iterator[tuple[int, int]]:
    """Split a window of offsets into reads of ``chunk_size`` samples or more: small samples
    are read together up to ``_READ_BYTES``, to pay one system call per block, not per few."""
    last = len(offsets) - 1
    a = 0
    while a < last:
        b = min(last, max(a + chunk_size, bisect_right(offsets, offsets[a] + _READ_BYTES, a) - 1))
        yield a, b
        a = b


def _span_error(path: Path, index: int, start: int, stop: int, size: int) -> FormatError:
    if stop < start:
        reason = f"offsets decrease (sample ends at byte {stop})"
    else:
        reason = f"truncated: sample ends at byte {stop} but the file has {size} bytes"
    return FormatError(reason, path=path, index=index, offset=start)


def _split(buffer: Any, offsets: Sequence[int], first: int, raw: bool, copy: bool, path: Path,
           size: int) -> Iterator:
    """The samples in ``buffer``, which holds bytes ``offsets[0]`` to ``offsets[-1]`` of the
    data file (fewer if it is truncated); ``first`` is the index of the first sample."""
    if raw:
        return _raw_samples(memoryview(buffer), offsets, first, copy, path, size)
    if len(buffer) <= _UNPACKER_MAX_MEAN * (len(offsets) - 1):
        return _unpacked_samples(buffer, offsets, first, path, size)
    return _decoded_samples(memoryview(buffer), offsets, first, path, size)


def _raw_samples(view: memoryview, offsets: Sequence[int], first: int, copy: bool, path: Path,
                 size: int) -> Iterator:
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        piece = view[start - base:stop - base]
        if len(piece) != stop - start or stop > size:
            raise _span_error(path, index, start, stop, size)
        yield bytes(piece) if copy else piece
        start = stop


def _decoded_samples(view: memoryview, offsets: Sequence[int], first: int, path: Path,
                     size: int) -> Iterator:
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        piece = view[start - base:stop - base]
        if len(piece) != stop - start:
            raise _span_error(path, index, start, stop, size)
        try:
            yield _unpackb(piece, strict_map_key=False, object_hook=_decode_numpy)
        except DECODE_ERRORS as error:
            raise FormatError(f"corrupt sample ({error})", path=path, index=index, offset=start) from error
        start = stop


def _unpacked_samples(buffer: Any, offsets: Sequence[int], first: int, path: Path,
                      size: int) -> Iterator:
    # Size limits come from the bytes at hand, so a corrupt length prefix fails at once
    # instead of allocating (or waiting for) gigabytes.
    n = len(buffer)
    unpacker = msgpack.Unpacker(strict_map_key=False, object_hook=_decode_numpy,
                                max_buffer_size=max(n, 1), max_str_len=n, max_bin_len=n,
                                max_array_len=n, max_map_len=n // 2, max_ext_len=n)
    unpacker.feed(buffer)
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        try:
            sample = unpacker.unpack()
        except (msgpack.OutOfData, *DECODE_ERRORS) as error:
            raise _sample_error(path, index, start, stop, base + n, size, error) from error
        if unpacker.tell() != stop - base:
            raise _sample_error(path, index, start, stop, base + n, size, None)
        yield sample
        start = stop


def _sample_error(path: Path, index: int, start: int, stop: int, available: int, size: int,
                  error: Exception | None) -> FormatError:
    if stop < start or stop > available:
        return _span_error(path, index, start, stop, size)
    reason = (f"corrupt sample ({error})" if error
              else "corrupt sample (its message does not end at the next offset)")
    return FormatError(reason, path=path, index=index, offset=start)


class ShardedReader(Reader):
    """Several datasets read as one, in order: a glob pattern (sorted matches) or a list of
    paths and readers.

    >>> from fpipe.storage import ListReader
    >>> first, second = ListReader([{"key": "a"}]), ListReader([{"key": "b"}, {"key": "c"}])
    >>> sharded = ShardedReader([first, second])
    >>> len(sharded), sharded.find_index("c"), [s["key"] for s in sharded.iter(0, 2)]
    (3, 2, ['a', 'b'])
    """

    def __init__(self, shards: Union[PathLike, Iterable[Union[PathLike, Reader]]]) -> None:
        if isinstance(shards, (str, os.PathLike)):
            pattern = os.fspath(shards)
            shards = sorted(glob.glob(pattern))
            if not shards:
                raise FileNotFoundError(errno.ENOENT, "no dataset matches the pattern", pattern)
        self.readers = [_as_reader(shard) for shard in shards]
        self._starts = [0]
        for reader in self.readers:
            self._starts.append(self._starts[-1] + len(reader))

    def __repr__(self) -> str:
        return f"ShardedReader({self.readers!r})"

    def __len__(self) -> int:
        return self._starts[-1]

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    def __contains__(self, key: object) -> bool:
        return any(key in reader for reader in self.readers)

    def _locate(self, index: int) -> tuple[Reader, int]:
        shard = bisect_right(self._starts, index) - 1
        return self.readers[shard], index - self._starts[shard]

    def find_key(self, index: int) -> Any:
        reader, local = self._locate(self._index(index))
        return reader.find_key(local)

    def find_index(self, key: Any) -> int:
        for start, reader in zip(self._starts, self.readers):
            if key in reader:
                return start + reader.find_index(key)
        raise KeyError(key)

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        reader, local = self._locate(self._index(index))
        return reader.get(local, yield_key, raw, copy)

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[Reader, int, int]]:
        for first, end, reader in zip(self._starts, self._starts[1:], self.readers):
            if first < stop and start < end:
                yield reader, max(start, first) - first, min(stop, end) - first

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        start, stop, _ = slice(start, stop).indices(len(self))
        return [sample for reader, a, b in self._pieces(start, stop)
                for sample in reader.get_slice(a, b, yield_key, raw, copy)]

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for reader, a, b in self._pieces(start, stop):
            yield from reader.iter(a, b, yield_key, raw, copy, chunk_size)


def _as_reader(shard: Union[PathLike, Reader]) -> Reader:
    if isinstance(shard, Reader):
        return shard
    if isinstance(shard, (str, os.PathLike)):
        return MsgpackReader(shard)
    raise TypeError(f"shards must be paths or readers; got {type(shard).__name__} {shard!r:.80}")
