"""Read packed datasets: :class:`MsgpackReader`, with the reader API
(:class:`~fpipe.dataset.base.Reader`) that :mod:`fpipe.dataset.sharded` and
:mod:`fpipe.dataset.unpacked` also offer (several datasets as one; lists, directories, zip files).

Every reader has ``len(r)``, ``key in r``, :meth:`~Reader.find_key`, :meth:`~Reader.find_index`,
:meth:`~Reader.get`, :meth:`~Reader.get_many`, :meth:`~Reader.get_slice`,
:meth:`~Reader.slice`, :meth:`~Reader.iter`, ``r[i]`` (negative ``i`` counts from the end)
and ``r[a:b:c]`` (a list, with Python's slice clamping, any step):

>>> import os, tempfile
>>> from fpipe.dataset import FileWriter
>>> path = os.path.join(tempfile.mkdtemp(), "digits.msgpack")
>>> with FileWriter(path) as writer:
...     for i in range(10):
...         writer.write({"key": f"d{i}", "value": i})
>>> reader = MsgpackReader(path)
>>> len(reader), "d3" in reader, reader.find_index("d3"), reader.get(-1)
(10, True, 3, {'key': 'd9', 'value': 9})
>>> len(reader[2:8:2]), reader.get_many([7, 2]) == reader[7:1:-5]
(3, True)

:class:`MsgpackReader` is thread-safe and fork-safe: it reads with ``os.pread``, never
seek-then-read on a shared file, and it pickles by path (the child reopens the files).
Iterators are independent of each other. It maps no file into memory, so a dataset that
another program truncates or rewrites under it raises :class:`~fpipe.errors.FormatError`
instead of killing the process with ``SIGBUS``.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
import threading
import warnings
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from fpipe.dataset._staging import missing_data_reason
from fpipe.dataset.base import Reader
from fpipe.dataset.format import (
    DECODE_ERRORS,
    BloomFilter,
    DatasetFiles,
    PathLike,
    corrupt_reason,
    hash_keys,
    md5_file,
    open_regular,
    read_key_hashes,
    read_legacy_index,
    read_md5,
)
from fpipe.dataset.format import decode_numpy as _decode_numpy
from fpipe.dataset.format import decode_numpy_copy as _decode_numpy_copy
from fpipe.dataset.keyindex import KeyIndex, KeyLookup, KeyTable, StaleKeyIndex, read_key_table
from fpipe.errors import FormatError
from fpipe.remote.urls import (
    RemoteOptions,
    check_remote,
    is_url,
    refuse_remote_options,
    takes_remote,
)

__all__ = ["MsgpackReader"]

_PAIR = struct.Struct(">QQ").unpack_from
_unpackb = msgpack.unpackb
_pread = os.pread
# Chunks whose samples average at most this many bytes decode through one Unpacker (fewer
# calls); bigger samples decode one by one from the buffer (no extra copy into the Unpacker).
_UNPACKER_MAX_MEAN = 8192
# Offsets files up to this size are read into memory for random access (8 bytes a sample);
# bigger ones are read two offsets per get, so that no process holds a gigabyte of them.
_RESIDENT_OFFSETS = 1 << 26
# Sequential reads fetch offsets this many at a time, and data in blocks of about this size.
_OFFSETS_WINDOW = 4096
_READ_BYTES = 1 << 18
# Reads into a buffer that lives on, up to this size: a fresh allocation of over 128 KiB is
# memory mapped anew, and costs a page fault per page it fills (more than the read itself).
_SCRATCH_MAX = 16 << 20


class _Buffer:
    """A buffer that reads reuse (see ``_SCRATCH_MAX``): an iterator's, or a thread's."""

    buffer = bytearray()

    def take(self, size: int) -> memoryview:
        """A view of ``size`` writable bytes, valid until the next ``take`` in this thread."""
        if size > len(self.buffer):
            if size > _SCRATCH_MAX:
                return memoryview(bytearray(size))
            self.buffer = bytearray(max(size, 2 * len(self.buffer)))
        return memoryview(self.buffer)[:size]


class _Scratch(_Buffer, threading.local):
    """The buffer of the reads of each thread that are done before the call returns."""


_scratch = _Scratch()


class _Handle:
    """One process's open view of a dataset: the data file and its offsets, both read with
    ``os.pread`` (the offsets of a random ``get`` come from memory once read; a legacy index
    is an array from the start).

    Nothing is memory-mapped. A mapped file that another program truncates kills the process
    with ``SIGBUS`` at the next touch of a page past its new end; a ``pread`` there comes back
    short instead, and the reader raises :class:`~fpipe.errors.FormatError` naming the file.

    Readers and iterators hold a reference; the files close when the last one lets go, so
    closing a reader never pulls a file out from under a running iterator.
    """

    __slots__ = ("fd", "offsets", "offsets_fd", "offsets_size", "opened", "size")

    def __init__(self, files: DatasetFiles, legacy_offsets: bytes | None) -> None:
        self.fd = self.offsets_fd = None
        self.fd = os.open(files.data, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self.opened = os.fstat(self.fd)
        self.size = self.opened.st_size
        self.offsets = legacy_offsets
        if legacy_offsets is None:
            self.offsets_fd = os.open(files.offsets, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            self.offsets_size = os.fstat(self.offsets_fd).st_size
        else:
            self.offsets_size = len(legacy_offsets)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close is bound early: at interpreter exit the os module may already be gone.
        for fd in (self.fd, self.offsets_fd):
            if fd is not None:
                _close(fd)

    def resident_offsets(self, path: Path) -> bytes | None:
        """All offsets, read into memory on first use (8 bytes a sample, shared with forked
        workers); None if the offsets file is too big to hold, and then each ``get`` reads
        its two offsets."""
        if self.offsets is None and self.offsets_size <= _RESIDENT_OFFSETS:
            self.offsets = self._pread_offsets(0, self.offsets_size, path)
        return self.offsets

    def offsets_between(self, start: int, stop: int, path: Path) -> tuple[int, ...]:
        """Offsets ``start`` to ``stop`` inclusive."""
        return struct.unpack(f">{stop - start + 1}Q", self._offset_bytes(start, stop, path))

    def offset_range(self, start: int, stop: int, path: Path) -> tuple[tuple[int, ...], int]:
        """Offsets ``start`` to ``stop`` inclusive, and how many of them from the first never
        decrease (all, unless the index is damaged)."""
        data = self._offset_bytes(start, stop, path)
        return struct.unpack(f">{stop - start + 1}Q", data), _increasing_run(data)

    def _offset_bytes(self, start: int, stop: int, path: Path) -> bytes:
        if self.offsets is None:
            return self._pread_offsets(8 * start, 8 * (stop - start + 1), path)
        return self.offsets[8 * start:8 * (stop + 1)]

    def _pread_offsets(self, start: int, size: int, path: Path) -> bytes:
        data = os.pread(self.offsets_fd, size, start)
        if len(data) != size:
            raise FormatError("the offsets file shrank while the reader had it open",
                              path=DatasetFiles(path).offsets)
        return data

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

    def read_into(self, scratch: _Buffer, start: int, stop: int) -> memoryview:
        """Like :meth:`read`, into ``scratch``'s buffer: a view valid until its next use."""
        wanted = min(stop, self.size) - start
        if wanted <= 0:
            return memoryview(b"")
        view, done = scratch.take(wanted), 0
        while done < wanted and (got := os.preadv(self.fd, [view[done:]], start + done)):
            done += got
        return view[:done]

    def check_unchanged(self, path: Path, index: int, offset: int) -> None:
        """Raise FormatError if the data file changed since it was opened: raw bytes are not
        decoded, so nothing else would notice that they came from another file."""
        changed = self.changed(FormatError("", path=path, index=index, offset=offset))
        if changed is not None:
            raise changed

    def changed(self, error: FormatError) -> FormatError | None:
        """If the data file changed since it was opened (another program truncated or
        rewrote it), an error that says so in place of ``error``, which the change caused."""
        now = os.fstat(self.fd)
        if _identity(now) == _identity(self.opened):
            return None
        if now.st_size < self.size:
            reason = (f"the data file shrank from {self.size} to {now.st_size} bytes while the "
                      f"reader had it open")
        else:
            cause = f" ({error.reason})" if error.reason else ""
            reason = f"the data file changed while the reader had it open{cause}"
        return FormatError(reason, path=error.path, index=error.index, offset=error.offset)


def _remote_dataset(path: Any, remote: RemoteOptions | None) -> Any:
    """A :class:`~fpipe.remote.urls.RemoteDataset` for a URL; None for a local path (which
    takes none of the remote options)."""
    remote = check_remote(remote)
    if isinstance(path, str) and "://" in path and is_url(path):
        from fpipe.remote.urls import RemoteDataset

        return RemoteDataset(path, remote)
    refuse_remote_options(path, remote)
    return None


class _LegacyIndex:
    """A dataset's legacy ``.index`` (its keys and offsets in one msgpack map), read once, when
    the first of them is needed: the byte source wants the offsets, the key lookup the keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read: tuple[KeyTable, bytes] | None = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "_read": None}

    def _tables(self) -> tuple[KeyTable, bytes]:
        if self._read is None:
            keys, offsets = read_legacy_index(self.path)
            self._read = KeyTable.from_keys(keys), offsets.astype(">u8").tobytes()
        return self._read

    def keys(self) -> KeyTable:
        return self._tables()[0]

    def offsets(self) -> bytes:
        return self._tables()[1]


class DatasetBytes:
    """The byte source of a packed dataset: where the samples' bytes come from, a local data
    file (read with ``os.pread``) or a URL (through the block cache of ``fpipe.remote``),
    and what ``len`` and the offsets say of them. :meth:`open` gives the open view that reads
    them (a :class:`_Handle`, or a ``RemoteHandle``), after checking
    that the files are still those it found when it was made. It pickles by its settings.
    :class:`MsgpackReader` is this and a :class:`DatasetKeys`.

    >>> import os, tempfile
    >>> from fpipe.dataset import FileWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with FileWriter(path) as writer:
    ...     writer.write({"key": "a"})
    >>> source = DatasetBytes(path)
    >>> source.n, source.url, source.open().read(0, 1)
    (1, None, b'\x81')
    """

    def __init__(self, path: PathLike, remote: RemoteOptions | None = None) -> None:
        # a local file (None) or a URL through the block cache
        self.remote = _remote_dataset(path, remote)
        # absolute: the reader (and a copy of it in a worker) reads the same files wherever
        # the current folder is when it opens them
        self.path = Path(path).absolute() if self.remote is None else self.remote.path
        self.files = DatasetFiles(self.path)
        if self.remote is None and self.path.is_dir():
            raise IsADirectoryError(errno.EISDIR, _folder_message(self.path), str(self.path))
        if self.remote is None and not self.path.is_file():
            raise FileNotFoundError(errno.ENOENT, missing_data_reason(self.path), str(self.path))
        self.identity = None if self.remote else _identity(os.stat(self.path))
        self.legacy = _LegacyIndex(self.path) if not self.files.offsets.exists() else None
        self.n = self._legacy_length() if self.legacy is not None else self._offsets_length()

    @property
    def url(self) -> str | None:
        """The URL of the data file, or None for a local file."""
        return self.remote.url if self.remote is not None else None

    @property
    def shown(self) -> str:
        """The URL, or the path, as messages show it."""
        return self.remote.url if self.remote is not None else str(self.path)

    @property
    def has_key_index(self) -> bool:
        """Whether the dataset's key index may be there: a local dataset that is not legacy (a
        URL does not fetch it)."""
        return self.remote is None and self.legacy is None

    @property
    def read_ahead(self) -> int:
        """The blocks fetched ahead of the order being read (0 for a local file)."""
        return self.remote.read_ahead if self.remote is not None else 0

    def _offsets_length(self) -> int:
        size = self.files.offsets.stat().st_size
        if size < 8 or size % 8:
            raise FormatError(f"an offsets file holds n + 1 uint64; got {size} bytes",
                              path=self.files.offsets)
        return size // 8 - 1

    def _legacy_length(self) -> int:
        index = self.files.legacy_index
        if not index.exists():
            raise FileNotFoundError(errno.ENOENT, "dataset index not found: need "
                                    f"{self.files.offsets.name} or {index.name}", str(self.files.offsets))
        with open_regular(index) as file:
            try:
                return msgpack.Unpacker(file, read_size=16).read_map_header()
            except (msgpack.OutOfData, *DECODE_ERRORS) as error:
                raise FormatError(f"corrupt legacy index ({error})", path=index) from error

    def open(self) -> _Handle:
        """An open view of the samples' bytes: the data file and its offsets."""
        if self.remote is not None:
            # the offsets file is a cached copy, fetched and checked once, in memory like a local one's
            return self.remote.handle(self.files.offsets.read_bytes())
        handle = _Handle(self.files, self.legacy.offsets() if self.legacy is not None else None)
        # what len() and the keys describe must be what the handle reads: a dataset replaced
        # or rewritten since this reader was made (or pickled) is another dataset
        if _identity(handle.opened) != self.identity:
            raise FormatError("the data file changed since the reader was made (it was replaced "
                              "or rewritten); make a new reader", path=self.path)
        if handle.offsets_size != 8 * (self.n + 1) and self.legacy is None:
            raise FormatError(f"the offsets file changed since the reader was made ({self.n} "
                              f"samples then, {handle.offsets_size} bytes now); make a new reader",
                              path=self.files.offsets)
        return handle

    def blocks(self, handle: Any) -> np.ndarray:
        """The bounds of the blocks of the cache of a URL's ``handle``: a block holds the
        samples that begin in it."""
        starts = np.frombuffer(handle.offsets, dtype=">u8")[:-1]
        edges = np.arange(0, max(1, handle.size), handle.block_size, dtype=np.uint64)
        firsts = np.searchsorted(starts, edges).astype(np.int64)
        return np.unique(np.concatenate((firsts, [0, handle.n])))

    def verify_data(self, handle: Any, read_size: int, progress: bool) -> bool:
        """Whether the data file matches its ``.md5`` entry and ends where the last sample of
        ``handle`` (one that :meth:`open` gave) ends."""
        expected = read_md5(self.path).get(self.path.name)
        if expected is None:
            raise FormatError(f"the md5 file has no entry for {self.path.name}", path=self.files.md5)
        last = handle.offsets_between(self.n, self.n, self.path)[0]
        if self.remote is not None:
            return last == handle.size and self.remote.verify_data(expected, read_size, progress)
        return last == os.stat(self.path).st_size and md5_file(self.path, read_size, progress) == expected

    def verify_index(self, read_size: int) -> bool:
        """Whether every index file that ``.md5`` lists exists and matches its checksum."""
        entries = read_md5(self.path)
        # a reader at a URL fetches no key index: it looks keys up in memory
        fetched = [path for path in self.files.index_files + (self.files.legacy_index,)
                   if self.remote is None or path != self.files.key_index]
        listed = [path for path in fetched if path.name in entries]
        return all(path.exists() and md5_file(path, read_size) == entries[path.name] for path in listed)


class MsgpackReader(Reader):
    """Read a packed dataset (datadings's format) by index, by key, or in order.

    A reader is two halves and the decoding between them: a :class:`DatasetBytes` (the bytes of
    sample ``i``, from a local file or a URL) and a :class:`DatasetKeys` (the key lookup: the
    key index, or the keys in memory). Its API is datadings's ``MsgpackReader(path,
    buffering=0)``, which ported code calls unchanged.

    Opening costs a few ``stat`` calls. The first ``get`` reads the offsets into memory (8 bytes
    a sample; an offsets file over 64 MiB stays on disk and each ``get`` reads its two), and
    keys, key hashes and the Bloom filter load on first use into numpy arrays (never Python
    lists). ``get`` is one ``os.pread``; ``iter`` reads ``chunk_size`` samples or more per
    ``os.pread`` (so forked workers iterating do not grow). ``buffering`` is accepted for
    datadings code and ignored. Keys are str: ``key in reader`` is False, and ``find_index(key)`` raises
    :class:`KeyError`, for anything else and for a str that UTF-8 cannot encode (one with a lone
    surrogate, such as a non-UTF-8 byte in a command-line argument).

    A missing ``.key_hashes`` is recomputed; a missing ``.filter`` leaves ``in`` working; a
    missing data file, or missing ``.offsets`` and legacy ``.index``, raises
    :class:`FileNotFoundError`. A truncated or corrupt sample raises
    :class:`~fpipe.errors.FormatError` (file, sample index, byte offset) when it is read.
    Decoded numpy arrays are writable copies; with ``copy=False`` they are read-only views of
    the decoded bytes (no copy), and writing one raises numpy's "read-only" ValueError
    (see the FAQ). A folder raises :class:`IsADirectoryError`.

    No file is memory-mapped, so changing a dataset under a reader never kills the process.
    A data file truncated or rewritten in place while open raises FormatError ("the data file
    shrank ..." or "... changed while the reader had it open") at the first read that does not
    fit, and at every raw read; a read that decodes cleanly from a rewritten file is not
    caught. Files deleted and replaced leave the open reader reading the old ones, whole; a
    reader that opens them anew (after :meth:`close`, or unpickled in a worker) raises
    FormatError, since ``len`` and the keys describe the old dataset.

    ``path`` may be a URL (``s3://``, ``gs://``, ``https://``, any fsspec scheme): the index
    files are fetched once, and samples are read by range in blocks through a local cache
    that the processes of a machine share. ``remote=RemoteOptions(...)`` sets how (the cache's
    folder and size in bytes, the block size, read-ahead, retries, timeout, fsspec's
    ``storage_options``); see :class:`~fpipe.remote.urls.RemoteOptions` and the guide
    "Datasets in object storage". They are only for URLs.

    >>> import os, tempfile
    >>> from fpipe.dataset import FileWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with FileWriter(path) as writer:
    ...     writer.write({"key": "a", "n": 1})
    ...     writer.write({"key": "b", "n": 2})
    >>> with MsgpackReader(path) as reader:
    ...     reader.get(1, yield_key=True), reader.get(0, raw=True)
    (('b', {'key': 'b', 'n': 2}), b'\\x82\\xa3key\\xa1a\\xa1n\\x01')
    """

    @takes_remote
    def __init__(self, path: PathLike, buffering: int = 0, *,
                 remote: RemoteOptions | None = None) -> None:
        # where the bytes come from, and how keys are looked up: the two halves of a reader
        self._bytes = DatasetBytes(path, remote)
        self.path, self._files, self._len = self._bytes.path, self._bytes.files, self._bytes.n
        self._reset()

    def _reset(self) -> None:
        self._handle: _Handle | None = None  # the open files, while the reader has them
        legacy = self._bytes.legacy
        self._keys = DatasetKeys(self._files, self._len, key_index=self._bytes.has_key_index,
                                 legacy=legacy.keys if legacy is not None else None)

    def __getstate__(self) -> dict:
        return {"path": self.path, "_files": self._files, "_len": self._len, "_bytes": self._bytes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return f"MsgpackReader({self._bytes.shown!r})"

    def __len__(self) -> int:
        return self._len

    @property
    def url(self) -> str | None:
        """The URL the reader reads, or None for a local file (then ``path`` is the file)."""
        return self._bytes.url

    @property
    def blocks(self) -> np.ndarray | None:
        """None for a local file (a sample costs one ``pread`` wherever it is); at a URL, the
        bounds of the blocks of the cache (a random sample costs a block's fetch), so that
        ``shuffle=True`` fetches each block once an epoch (see
        :class:`~fpipe.dataset.base.Reader`)."""
        if self._bytes.remote is None:
            return None
        return self._bytes.blocks(self._handle or self._open())

    def close(self) -> None:
        """Let go of the open files (running iterators keep theirs); reopened when needed."""
        self._handle = None

    def _close(self) -> None:
        """:meth:`close` under datadings's name for it, which ported code calls."""
        self.close()

    def _open(self) -> _Handle:
        handle = self._handle = self._bytes.open()
        return handle

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def find_index(self, key: Any) -> int:
        """The index of ``key`` by its salted 64-bit hash: with a few reads of the key index
        where the dataset has one, else from the key hashes, sorted in memory once (the keys
        file is not loaded).

        >>> import tempfile
        >>> from fpipe.dataset import FileWriter
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.find_index("c")
        2
        >>> reader.find_index("z")
        Traceback (most recent call last):
        ...
        KeyError: 'z'
        """
        found = self._keys.find(key)
        if found < 0:
            raise KeyError(key)
        return found

    def find_key(self, index: int) -> str:
        """The key of sample ``index``: two reads of the key index where the dataset has one,
        else from the keys, loaded into a compact table once.

        >>> import tempfile
        >>> from fpipe.dataset import FileWriter
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.find_key(0), reader.find_key(-1)
        ('a', 'c')
        """
        return self._keys[self._index(index)]

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        handle = self._handle or self._open()
        if type(index) is not int or not 0 <= index < self._len:
            index = self._index(index)
        offsets = handle.offsets or handle.resident_offsets(self.path)
        start, stop = (_PAIR(offsets, index << 3) if offsets is not None
                       else handle.offsets_between(index, index + 1, self.path))
        if not start <= stop <= handle.size:
            raise _span_error(self.path, index, start, stop, handle.size)
        fd = handle.fd  # None at a URL: the bytes come from the block cache
        data = _pread(fd, stop - start, start) if fd is not None else handle.read(start, stop)
        if raw or len(data) != stop - start:
            data = self._whole(handle, data, index, start, stop)
        if not raw:
            try:
                data = _unpackb(data, strict_map_key=False, object_hook=_decoder(copy))
            except DECODE_ERRORS as error:
                corrupt = FormatError(corrupt_reason(error, data), path=self.path, index=index,
                                      offset=start)
                raise handle.changed(corrupt) or corrupt from error
        sample = memoryview(data) if raw and not copy else data
        if yield_key:
            return self._keys[index], sample
        return sample

    def _whole(self, handle: _Handle, data: bytes, index: int, start: int, stop: int) -> bytes:
        """``data`` (sample ``index``, from byte ``start``) completed to ``stop``, from a file
        that has not changed since it was opened; FormatError otherwise."""
        if len(data) != stop - start:
            data = handle.read(start, stop)  # one pread returns at most about 2 GiB
        if len(data) != stop - start:
            short = _span_error(self.path, index, start, stop, start + len(data))
            raise handle.changed(short) or short
        handle.check_unchanged(self.path, index, start)
        return data

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        """Samples ``start`` to ``stop`` as a list, cut from one read.

        The building block for chunked orderings: one contiguous read, then per-sample
        decoding (or raw per-sample ``bytes``/``memoryview`` with ``raw=True``).
        """
        start, stop, _ = slice(start, stop).indices(self._len)
        if start >= stop:
            return []
        handle = self._handle or self._open()
        handle.resident_offsets(self.path)
        offsets = handle.offsets_between(start, stop, self.path)
        # the largest offset, not the last: a damaged index may decrease, and then the error
        # names the sample where it does, not one whose bytes were left unread
        buffer = _block(handle, offsets[0], max(offsets), raw and not copy, _scratch)
        if raw:
            handle.check_unchanged(self.path, start, offsets[0])
        try:
            samples = list(_split(buffer, offsets, start, raw, copy, self.path, handle.size))
        except FormatError as error:
            changed = handle.changed(error)
            if changed is None:
                raise
            raise changed from error
        if not yield_key:
            return samples
        return list(zip(self._keys.keys(start, stop), samples))

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        handle = self._handle or self._open()
        window = max(chunk_size, _OFFSETS_WINDOW)
        # the iterator's own buffer: it yields a block's samples before it reads the next one
        scratch = _Buffer() if not (raw and not copy) else None
        for first in range(start, stop, window):
            offsets, increasing = handle.offset_range(first, min(stop, first + window), self.path)
            # blocks span increasing offsets only: the samples before a decrease are read,
            # then the sample that ends before it starts raises
            for a, b in _reads(offsets[:increasing], chunk_size):
                samples = self._block_samples(handle, offsets[a:b + 1], first + a, raw, copy,
                                              scratch)
                try:
                    if not yield_key:
                        yield from samples
                    else:
                        yield from zip(self._keys.keys(first + a, first + b), samples)
                except FormatError as error:
                    changed = handle.changed(error)
                    if changed is None:
                        raise
                    raise changed from error
            if increasing < len(offsets):
                last = increasing - 1
                raise _span_error(self.path, first + last, offsets[last], offsets[increasing],
                                  handle.size)

    def _block_samples(self, handle: _Handle, offsets: Sequence[int], first: int, raw: bool,
                       copy: bool, scratch: _Buffer | None) -> Iterator:
        """The samples between ``offsets`` (increasing), the first of them ``first``."""
        block = _block(handle, offsets[0], offsets[-1], scratch is None, scratch)
        if raw:
            handle.check_unchanged(self.path, first, offsets[0])
        return _split(block, offsets, first, raw, copy, self.path, handle.size)

    def verify_data(self, read_size: int = 512 * 1024, progress: bool = False) -> bool:
        """Whether the data file matches its ``.md5`` entry and ends where the last sample ends.

        Detects truncated, corrupted and extended data files. Reads the whole file.

        >>> import tempfile
        >>> from fpipe.dataset import FileWriter
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.verify_data()
        True
        >>> with open(path, "ab") as file:
        ...     _ = file.write(b"extra")
        >>> reader.verify_data()
        False
        """
        return self._bytes.verify_data(self._handle or self._open(), read_size, progress)

    def prefetch(self, indices: Sequence[int]) -> None:
        """Fetch in the background the blocks that samples ``indices`` need, in that order
        (a reader at a URL; nothing to do for a local file). Orderings call it."""
        if self._bytes.read_ahead:
            (self._handle or self._open()).prefetch(indices)

    def verify_index(self, read_size: int = 512 * 1024) -> bool:
        """Whether every index file that ``.md5`` lists exists and matches its checksum.

        >>> import tempfile
        >>> from fpipe.dataset import FileWriter
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.verify_index()
        True
        >>> with open(path + ".keys", "r+b") as file:
        ...     _ = file.write(b"\\x00")
        >>> reader.verify_index()
        False
        """
        return self._bytes.verify_index(read_size)


class DatasetKeys:
    """The key lookup of a packed dataset (a ``KeyLookup``): its key
    index where it has one (``key_index``: a local dataset that is not legacy), else a
    ``KeyTable`` that loads ``.keys`` (or the legacy ``.index``,
    from ``legacy``) when a key is asked for, and ``.key_hashes`` (recomputed from the keys
    where it is missing) when an index is. A key index that fails a check is left aside with a
    warning, and the question asked again of the table. While no lookup table is open, ``in``
    asks the Bloom filter ``.filter`` first (a key that is not there costs no table).

    >>> import os, tempfile
    >>> from fpipe.dataset import FileWriter
    >>> from fpipe.dataset.format import DatasetFiles
    >>> path = os.path.join(tempfile.mkdtemp(), "pets.msgpack")
    >>> with FileWriter(path) as writer:
    ...     for key in ("cat", "dog"):
    ...         writer.write({"key": key})
    >>> keys = DatasetKeys(DatasetFiles(path), 2, key_index=False)
    >>> "dog" in keys, keys.find("cow"), keys[0], keys.keys(0, 2)
    (True, -1, 'cat', ['cat', 'dog'])
    """

    def __init__(self, files: DatasetFiles, n: int, *, key_index: bool = True,
                 legacy: Callable[[], KeyTable] | None = None) -> None:
        self._files, self._n, self._legacy = files, n, legacy
        self._index: KeyIndex | bool | None = None if key_index else False
        self._table: KeyTable | None = None
        self._keys_only = False  # a key index failed a check: .key_hashes is not trusted either
        self._bloom: BloomFilter | bool | None = None

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> str:
        if self._index is False:  # no key index: the table answers alone
            return (self._table if self._table is not None else self._memory())[index]
        return self._asked(itemgetter(index))

    def keys(self, start: int, stop: int) -> list[str]:
        return self._asked(methodcaller("keys", start, stop))

    def find(self, key: Any) -> int:
        if not isinstance(key, str):
            return -1
        if self._index is False:
            return (self._table if self._table is not None else self._memory()).find(key)
        return self._asked(methodcaller("find", key))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if self._on_disk() is None and not (self._table is not None and self._table.hashed):
            bloom = self._filter()
            if bloom is not None and key not in bloom:
                return False
        return self.find(key) >= 0

    def _asked(self, question: Callable[[KeyLookup], Any]) -> Any:
        """``question`` asked of the key index, or of the table in memory; when the key index
        answers it with an error, asked again of the table."""
        index = self._on_disk()
        if index is not None:
            try:
                return question(index)
            except FormatError as error:
                self._leave_key_index_aside(error)
        return question(self._memory())

    def _on_disk(self) -> KeyIndex | None:
        """The dataset's key index, opened once; None without one, or when it fails its
        checks (then with a warning)."""
        if self._index is None:
            try:
                self._index = KeyIndex.open(self._files, self._n) or False
            except FormatError as error:
                self._leave_key_index_aside(error)
        return self._index or None

    def _leave_key_index_aside(self, error: FormatError) -> None:
        """Look keys up in the table made from ``.keys`` from now on: the key index failed a
        check (``error``), and answers from it could be wrong. The hashes are computed anew
        from ``.keys`` (``.key_hashes`` may be as old as a damaged key index), or read from
        ``.key_hashes`` for a stale one (the program that rewrote the keys wrote them)."""
        self._keys_only = not isinstance(error, StaleKeyIndex)
        where = (f"in {self._files.keys.name}, in memory" if self._keys_only else
                 "in memory, as for a dataset without one")
        warnings.warn(f"{error}; the key index is left aside and keys are looked up {where} "
                      f"('fpipe index --keys {self._files.data}' writes it anew)",
                      stacklevel=_caller_level())
        self._index = False

    def _memory(self) -> KeyTable:
        if self._table is None:
            self._table = KeyTable(load=self._load_keys, hashes=self._load_hashes)
        return self._table

    def _load_keys(self) -> KeyTable:
        if self._legacy is not None:
            return self._legacy()
        if not self._files.keys.exists():
            raise FileNotFoundError(errno.ENOENT, "dataset keys file not found", str(self._files.keys))
        return read_key_table(self._files.keys, self._n)

    def _load_hashes(self) -> tuple[bytes, np.ndarray]:
        if self._legacy is None and not self._keys_only and self._files.key_hashes.exists():
            salt, hashes = read_key_hashes(self._files.data)
            if len(hashes) != self._n:
                raise FormatError(f"{len(hashes)} key hashes for {self._n} samples",
                                  path=self._files.key_hashes)
            return salt, hashes
        table = self._memory()
        try:
            return hash_keys(table.keys(0, len(table)))
        except RuntimeError as error:  # the same key twice
            keys = self._files.legacy_index if self._legacy is not None else self._files.keys
            raise FormatError(f"corrupt keys ({error})", path=keys) from error

    def _filter(self) -> BloomFilter | None:
        if self._bloom is None:
            path = self._files.filter
            try:
                with open_regular(path) as file:
                    data = file.read()
            except FileNotFoundError:
                self._bloom = False
                return None
            try:
                self._bloom = BloomFilter.loads(data)
            except ValueError as error:
                raise FormatError(f"corrupt Bloom filter ({error})", path=path) from error
        return self._bloom or None


def _caller_level() -> int:
    """The ``stacklevel`` of a warning that names the first caller outside this package (the
    user's line), from the function that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _block(handle: _Handle, start: int, stop: int, kept: bool, scratch: _Buffer | None) -> Any:
    """Bytes ``[start, stop)`` of the data file: in ``scratch`` unless they are ``kept`` (raw
    samples handed out as views of the block), or come from a URL's block cache."""
    if kept or handle.fd is None:
        return handle.read(start, stop)
    return handle.read_into(scratch, start, stop)


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    """What tells a data file from another one at the same path, or from itself rewritten:
    size and modification time. (Not the inode: some FUSE file systems number a file anew
    each time the kernel forgets it, which would be a false alarm.)"""
    return stat.st_size, stat.st_mtime_ns


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
        reason = (f"truncated: sample ends at byte {stop} but the file has {size} bytes; "
                  f"'fpipe index {path}' keeps every complete sample and rebuilds the index")
    return FormatError(reason, path=path, index=index, offset=start)


def _split(buffer: Any, offsets: Sequence[int], first: int, raw: bool, copy: bool, path: Path,
           size: int) -> Iterator:
    """The samples in ``buffer``, which holds bytes ``offsets[0]`` to ``offsets[-1]`` of the
    data file (fewer if it is truncated); ``first`` is the index of the first sample."""
    if raw:
        return _raw_samples(memoryview(buffer), offsets, first, copy, path, size)
    if len(buffer) <= _UNPACKER_MAX_MEAN * (len(offsets) - 1):
        return _unpacked_samples(buffer, offsets, first, copy, path, size)
    return _decoded_samples(memoryview(buffer), offsets, first, copy, path, size)


def _decoder(copy: bool) -> Callable[[dict], Any]:
    # with copy=False arrays stay read-only views of the bytes msgpack decoded (no copy)
    return _decode_numpy_copy if copy else _decode_numpy


def _folder_message(path: Path) -> str:
    datasets = sorted(child.name for child in path.glob("*.msgpack"))
    if datasets:
        return f"a folder, not a dataset data file; it holds {', '.join(datasets[:5])}"
    return ("a folder, not a dataset data file (X.msgpack); read a folder of files with "
            "DirectoryReader, or pack it with 'fpipe write'")


def _raw_samples(view: memoryview, offsets: Sequence[int], first: int, copy: bool, path: Path,
                 size: int) -> Iterator:
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        piece = view[start - base:stop - base]
        if len(piece) != stop - start or stop > size:
            raise _span_error(path, index, start, stop, size)
        yield bytes(piece) if copy else piece
        start = stop


def _decoded_samples(view: memoryview, offsets: Sequence[int], first: int, copy: bool,
                     path: Path, size: int) -> Iterator:
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        piece = view[start - base:stop - base]
        if len(piece) != stop - start:
            raise _span_error(path, index, start, stop, size)
        try:
            yield _unpackb(piece, strict_map_key=False, object_hook=_decoder(copy))
        except DECODE_ERRORS as error:
            raise FormatError(corrupt_reason(error, piece), path=path, index=index,
                              offset=start) from error
        start = stop


def _unpacked_samples(buffer: Any, offsets: Sequence[int], first: int, copy: bool, path: Path,
                      size: int) -> Iterator:
    # Size limits come from the bytes at hand, so a corrupt length prefix fails at once
    # instead of allocating (or waiting for) gigabytes.
    n = len(buffer)
    unpacker = msgpack.Unpacker(strict_map_key=False, object_hook=_decoder(copy),
                                max_buffer_size=max(n, 1), max_str_len=n, max_bin_len=n,
                                max_array_len=n, max_map_len=n // 2, max_ext_len=n)
    unpacker.feed(buffer)
    base = start = offsets[0]
    for index, stop in enumerate(islice(offsets, 1, None), first):
        try:
            sample = unpacker.unpack()
        except (msgpack.OutOfData, *DECODE_ERRORS) as error:
            raise _sample_error(path, index, start, stop, buffer, base, size, error) from error
        if unpacker.tell() != stop - base:
            raise _sample_error(path, index, start, stop, buffer, base, size, None)
        yield sample
        start = stop


def _sample_error(path: Path, index: int, start: int, stop: int, buffer: Any, base: int,
                  size: int, error: Exception | None) -> FormatError:
    """The error for sample ``index``, whose bytes ``[start, stop)`` of the data file are in
    ``buffer`` from byte ``base`` (or run past its end)."""
    if stop < start or stop > base + len(buffer):
        return _span_error(path, index, start, stop, size)
    piece = memoryview(buffer)[start - base:stop - base]
    if error is None:
        # the Unpacker read across the offset: decoding the sample alone says what is there
        try:
            _unpackb(piece, strict_map_key=False)
        except DECODE_ERRORS as alone:
            error = alone
    return FormatError(corrupt_reason(error, piece), path=path, index=index, offset=start)
