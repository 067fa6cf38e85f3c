"""What the readers of other training formats share (:mod:`fpipe.formats.webdataset`,
:mod:`fpipe.formats.tfrecord`, :mod:`fpipe.formats.parquet`): a file's bytes by range, local or
at a URL (:class:`ByteSource`); index arrays built once per file and kept in the cache folder
(:func:`cached_index`); keys as a :class:`~fpipe.dataset.keyindex.KeyTable` (the key lookup of
the packed format's readers too); shard
lists from brace and glob patterns (:func:`expand_shards`); and :class:`SpanReader`, the reader
of files whose samples are runs of bytes (tar members, TFRecord records).

>>> expand_shards("train-{000..002}.tar", must_exist=False)
['train-000.tar', 'train-001.tar', 'train-002.tar']
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import struct
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from fpipe.dataset._staging import (
    DISK_FULL,
    disk_full,
    folder_size,
    refuse_inputs,
    signals_deferred,
)
from fpipe.dataset.base import Reader
from fpipe.dataset.format import PathLike, pack_sample
from fpipe.dataset.keyindex import KeyTable
from fpipe.errors import FormatError, redacted_url
from fpipe.remote.urls import RemoteOptions, check_remote, refuse_remote_options

__all__ = ["ByteSource", "ShardFiles", "SpanReader", "cached_index", "checked_spans",
           "expand_shards", "finish_export", "pending_export", "pin_index", "renamed", "same_bytes",
           "strings_from_arrays", "strings_to_arrays", "write_shards"]

#: The journal of an export's commit under way, in the staging folder of its first shard.
EXPORT_JOURNAL = "export.json"
# Sequential scans (building an index) read the file in windows of this many bytes.
SCAN_WINDOW = 1 << 16
# Iteration reads runs of samples up to about this many bytes at once.
_READ_BYTES = 1 << 20
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_INDEX_VERSION = "1"


# --- bytes by range --------------------------------------------------------------------------

class _RemoteFile:
    """A :class:`~fpipe.remote.cache.CachedFile` for any file at a URL: what a
    :class:`~fpipe.remote.cache.RemoteHandle` needs of it (its size, the block settings,
    the cache folder and the fetcher). The file is cut into blocks of ``block_size`` bytes,
    block ``k`` standing for the handle's sample ``k``, so that the block cache, its budget,
    its locks and its read-ahead serve it as they serve a packed dataset."""

    def __init__(self, url: str, remote: RemoteOptions) -> None:
        from fpipe.remote.cache import Budget, dataset_folder
        from fpipe.remote.urls import Retrying, check_options

        self.url = url
        self.block_size, limit, self.read_ahead, retries, timeout = remote.settings
        self.source = Retrying(url, check_options(remote.storage_options), timeout, retries)
        self.size, tag = self.source.stat()
        # the same cache for any credentials: they open the door, they do not change the data
        self.identity = f"{redacted_url(url)}\0{self.size}\0{tag}"
        self.budget = Budget(cache_root(remote.cache_dir), limit)
        self.folder = dataset_folder(self.budget.root,
                                     hashlib.sha256(self.identity.encode()).hexdigest()[:32])

    def handle(self) -> Any:
        from fpipe.remote.cache import RemoteHandle

        starts = np.arange(0, self.size, self.block_size, dtype=np.uint64)
        offsets = np.append(starts, np.uint64(self.size)).astype(">u8").tobytes()
        return RemoteHandle(self, offsets)


def cache_root(cache_dir: PathLike | None) -> Path:
    """The cache folder: ``cache_dir``, else the one datasets at URLs use."""
    if cache_dir is not None:
        return Path(os.fspath(cache_dir))
    from fpipe.remote.urls import default_cache_dir

    return default_cache_dir()


class ByteSource:
    """The bytes of one file by range: ``os.pread`` on a local file, the block cache (see
    :mod:`fpipe.remote.urls`) for a URL. Thread- and fork-safe; pickles by its settings
    (a worker opens the file itself). ``path`` is the path or URL as messages show it (a URL's
    user information hidden).

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"0123456789")
    >>> source = ByteSource(path)
    >>> source.size, source.read(2, 5), source.read(8, 20)
    (10, b'234', b'89')
    """

    # so that __del__ finds them when __init__ raised before it set them
    _fd: int | None = None
    _pid = -1

    def __init__(self, path: PathLike, remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        location = os.fspath(path)
        # absolute, as for MsgpackReader: a worker's current folder may be another one
        self._location = location if _is_url(location) else os.path.abspath(location)
        self.path = redacted_url(self._location)
        self._remote: _RemoteFile | None = None
        self._fd: int | None = None
        self._handle: Any = None
        self._pid = -1
        if _is_url(self._location):
            self._remote = _RemoteFile(self._location, remote)
            self.size, self.identity = self._remote.size, self._remote.identity
        else:
            # a local file's index is kept in cache_dir too
            refuse_remote_options(self.path, remote, allowed=("cache_dir",))
            stat = _stat_file(self.path)
            self.size = stat.st_size
            # the change time too: a copy over the file (cp -p) keeps the rest
            self.identity = (f"{os.path.realpath(self.path)}\0{stat.st_size}\0{stat.st_mtime_ns}"
                             f"\0{stat.st_ino}\0{stat.st_ctime_ns}")

    @property
    def remote(self) -> bool:
        """Whether the file is at a URL."""
        return self._remote is not None

    @property
    def name(self) -> str:
        """The file's name (the last part of its path, or of its URL's path: a query, such as a
        presigned URL's signature, is not part of it)."""
        path = self.path
        if self.remote:
            from fpipe.remote.urls import split_query

            path = split_query(path)[0]
        return path.rstrip("/").rsplit("/", 1)[-1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_handle": None, "_pid": -1}

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        if self._fd is not None and self._pid == os.getpid():
            _close(self._fd)

    def close(self) -> None:
        """Close the file (it reopens at the next read)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = self._handle = None

    def _open(self) -> None:
        if self._remote is not None:
            self._handle = self._remote.handle()
        else:
            self._fd = os.open(self._location, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            if os.fstat(self._fd).st_size != self.size:
                raise FormatError(f"the file changed size since it was opened (now "
                                  f"{os.fstat(self._fd).st_size} bytes, was {self.size})",
                                  path=self.path)
        self._pid = os.getpid()

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` (fewer past the end of the file)."""
        if self._pid != os.getpid():
            self._open()
        stop = min(stop, self.size)
        if stop <= start:
            return b""
        if self._handle is not None:
            return bytes(self._handle.read(start, stop))
        data = os.pread(self._fd, stop - start, start)
        while len(data) < stop - start:  # one pread returns at most about 2 GiB
            more = os.pread(self._fd, stop - start - len(data), start + len(data))
            if not more:
                break
            data += more
        return data

    def prefetch(self, starts: Sequence[int] | np.ndarray) -> None:
        """A hint: the bytes at offsets ``starts`` will be read next, in this order (a file at
        a URL fetches their blocks in the background; a local file has nothing to do)."""
        if self._remote is None or not self._remote.read_ahead:
            return
        if self._pid != os.getpid():
            self._open()
        blocks = np.asarray(starts, dtype=np.int64) // self._remote.block_size
        unique, first = np.unique(blocks, return_index=True)
        self._handle.prefetch(unique[np.argsort(first)])

    def prefetch_spans(self, spans: Iterable[tuple[int, int]]) -> None:
        """Like :meth:`prefetch`, for every byte of the ``(start, stop)`` spans."""
        if self._remote is None:
            return
        size = self._remote.block_size
        self.prefetch([offset for start, stop in spans
                       for offset in range(start - start % size, stop, size)])

    def file(self) -> io.RawIOBase:
        """A read-only, seekable file object over the bytes (for libraries that want one)."""
        return _SourceFile(self)


class _SourceFile(io.RawIOBase):
    """A :class:`ByteSource` as a seekable binary file."""

    def __init__(self, source: ByteSource) -> None:
        self.source, self.position = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.position, self.source.size)[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def size(self) -> int:
        return self.source.size

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(self.position, self.position + len(buffer))
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        stop = self.source.size if size is None or size < 0 else self.position + size
        data = self.source.read(self.position, stop)
        self.position += len(data)
        return data


def _is_url(path: str) -> bool:
    from fpipe.remote.urls import is_url

    return is_url(path)


def _stat_file(path: str) -> os.stat_result:
    stat = os.stat(path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "a folder, not a file", path)
    return stat


class Scanner:
    """Sequential reads of a :class:`ByteSource` through a window, for building an index:
    ``take(start, stop)`` costs a read only when the bytes leave the window."""

    def __init__(self, source: ByteSource, window: int = SCAN_WINDOW) -> None:
        self.source, self.window = source, window
        self.start, self.data = 0, b""

    def take(self, start: int, stop: int) -> bytes:
        if not (self.start <= start and stop <= self.start + len(self.data)):
            self.start = start
            self.data = self.source.read(start, max(stop, start + self.window))
        return self.data[start - self.start:stop - self.start]


# --- indexes kept in the cache ---------------------------------------------------------------

def cached_index(source: ByteSource, kind: str, build: Callable[[], dict[str, np.ndarray]],
                 cache_dir: PathLike | None = None,
                 fits: Callable[[dict[str, np.ndarray]], bool] = lambda index: True,
                 ) -> dict[str, np.ndarray]:
    """The index arrays of ``source``, made by ``build()`` once and kept in the cache folder
    (keyed by the file's path or URL, size, modification and change times and inode, or
    ETag, so a changed file gets a new index). A cache that cannot be written leaves the
    index unsaved; a cached index that cannot be read, or that ``fits(index)`` finds does not
    fit the file, is rebuilt.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "x.bin")
    >>> _ = open(path, "wb").write(b"abc")
    >>> built = []
    >>> def build():
    ...     built.append(1)
    ...     return {"starts": np.arange(3)}
    >>> for _ in range(2):
    ...     index = cached_index(ByteSource(path), "demo", build, cache_dir=folder)
    >>> index["starts"].tolist(), len(built)
    ([0, 1, 2], 1)
    """
    folder = _index_folder(cache_dir)
    if folder is None:  # a cache folder that is not the user's alone: no index is kept
        return build()
    name = hashlib.sha256(f"{_INDEX_VERSION}\0{kind}\0{source.identity}".encode()).hexdigest()
    path = folder / f"{name[:32]}.index"
    try:
        index = _load_index(path.read_bytes())
        if fits(index):
            return index
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    index = build()
    _store_index(path, index)
    return index


# --- an index tied to the bytes it was made from ---------------------------------------------
# A file copied over another with ``cp -p`` keeps its size, modification time and inode (and
# some file systems do not tell its change time), so an index in the cache also keeps a digest
# of a few spans of the bytes it was made from, read again and compared at each open.

#: at most this many spans are read to check an index: the file's two ends and the spans of up
#: to 16 of its entries
CHECKED_SPANS = 18


def checked_spans(size: int, edge: int, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The ``(start, stop)`` spans whose digest ties an index to its file of ``size`` bytes:
    its first and last ``edge`` bytes, and ``starts[i]:stops[i]`` for up to
    ``CHECKED_SPANS - 2`` entries ``i`` spread over them, the first and last among them.

    >>> checked_spans(100, 4, np.array([0, 30, 60]), np.array([12, 42, 72])).tolist()
    [[0, 4], [96, 100], [0, 12], [30, 42], [60, 72]]
    """
    starts, stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
    picked = np.unique(np.linspace(0, len(starts) - 1, min(len(starts), CHECKED_SPANS - 2))
                       .astype(np.int64))
    ends = np.array([[0, min(size, edge)], [max(0, size - edge), size]], np.int64)
    return np.concatenate([ends, np.stack([starts[picked], stops[picked]], axis=1)]).astype(np.int64)


def pin_index(source: ByteSource, spans: np.ndarray) -> dict[str, np.ndarray]:
    """The entries to add to an index to tie it to the bytes of ``spans`` in ``source`` (as
    :func:`checked_spans` chooses them), checked at each open by :func:`same_bytes`."""
    return {"checked_spans": spans, "checked_digest": _span_digest(source, spans)}


def same_bytes(source: ByteSource, index: dict[str, np.ndarray]) -> bool:
    """Whether the spans that ``index`` was pinned to (:func:`pin_index`) still hold the bytes
    they held (at most ``CHECKED_SPANS`` small reads). A file at a URL has a new ETag when its
    bytes change, and is not read again for it.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"abcdef")
    >>> index = pin_index(ByteSource(path), checked_spans(6, 2, np.array([2]), np.array([3])))
    >>> _ = open(path, "wb").write(b"abCdef")
    >>> same_bytes(ByteSource(path), index)
    False
    """
    if source.remote:
        return True
    spans, digest = index["checked_spans"], index["checked_digest"]
    return bool(spans.ndim == 2 and spans.shape[1] == 2 and len(spans) <= CHECKED_SPANS
                and (spans[:, 0] >= 0).all() and (spans[:, 0] <= spans[:, 1]).all()
                and (spans[:, 1] <= source.size).all()
                and np.array_equal(_span_digest(source, spans), digest))


def _span_digest(source: ByteSource, spans: np.ndarray) -> np.ndarray:
    digest = hashlib.blake2b(digest_size=16)
    for start, stop in spans.tolist():
        digest.update(source.read(start, stop))
    return np.frombuffer(digest.digest(), np.uint8)


def _index_folder(cache_dir: PathLike | None) -> Path | None:
    """The private folder of the indexes in the cache folder (both 0700, the user's), or None
    when it cannot be had (read-only, another user's, writable by others)."""
    from fpipe.remote.cache import private_folder

    try:
        return private_folder(private_folder(cache_root(cache_dir)) / "indexes")
    except OSError:
        return None


_MAGIC = b"FPIPEIDX"
_HEADER_LENGTH = struct.Struct("<Q")


def _index_bytes(index: dict[str, np.ndarray]) -> bytes:
    """The arrays as one file: a magic, a JSON header (name, dtype, shape, offset of each) and
    the arrays' bytes; loading it is one read, without the per-array cost of an npz."""
    layout, parts, offset = {}, [], 0
    for name, array in index.items():
        array = np.ascontiguousarray(array)
        layout[name] = [array.dtype.str, list(array.shape), offset]
        data = array.tobytes()
        parts.append(data + bytes(-len(data) % 8))  # each array aligned, as NumPy wants it
        offset += len(parts[-1])
    header = json.dumps(layout).encode()
    header += b" " * (-(len(_MAGIC) + _HEADER_LENGTH.size + len(header)) % 8)
    return b"".join([_MAGIC, _HEADER_LENGTH.pack(len(header)), header, *parts])


def _load_index(data: bytes) -> dict[str, np.ndarray]:
    if data[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not an index file")
    start = len(_MAGIC) + _HEADER_LENGTH.size
    (length,) = _HEADER_LENGTH.unpack_from(data, len(_MAGIC))
    layout = json.loads(data[start:start + length])
    base = start + length
    index = {}
    for name, (dtype, shape, offset) in layout.items():
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise ValueError("an index holds no objects")
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or base + offset + count * dtype.itemsize > len(data):
            raise ValueError("the index file is cut short")
        index[name] = np.frombuffer(data, dtype, count, base + offset).reshape(shape)
    return index


def _store_index(path: Path, index: dict[str, np.ndarray]) -> None:
    from fpipe.remote.cache import write_atomically

    try:
        write_atomically(path, _index_bytes(index))
    except OSError:
        pass  # a read-only cache: the index is built again next time


def strings_to_arrays(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as a UTF-8 byte array and the end of each (to keep them in an index file).

    >>> blob, ends = strings_to_arrays(["ab", "", "c"])
    >>> blob.tobytes(), ends.tolist(), strings_from_arrays(blob, ends)
    (b'abc', [2, 2, 3], ['ab', '', 'c'])
    """
    encoded = [text.encode("utf-8", "surrogateescape") for text in strings]
    ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))
    return np.frombuffer(b"".join(encoded), np.uint8), ends


def strings_from_arrays(blob: np.ndarray, ends: np.ndarray) -> list[str]:
    """The strings that :func:`strings_to_arrays` stored."""
    data = blob.tobytes()
    starts = [0, *ends[:-1].tolist()]
    return [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, ends.tolist())]


# --- keys --------------------------------------------------------------------------------------

def numbered_key(name: str, index: int) -> str:
    """The key of a sample that its format does not name: ``<file name>:<index>``."""
    return f"{name}:{index}"


def numbered_keys(name: str, start: int, stop: int) -> list[str]:
    """The :func:`numbered_key` of samples ``start`` to ``stop`` of file ``name``."""
    return [f"{name}:{index}" for index in range(start, stop)]


def numbered_index(name: str, key: Any, n: int) -> int:
    """The index that :func:`numbered_key` ``key`` names in file ``name``, or -1."""
    if not isinstance(key, str) or not key.startswith(name + ":"):
        return -1
    number = key[len(name) + 1:]
    if not number.isdigit() or str(int(number)) != number or int(number) >= n:
        return -1
    return int(number)


# --- shard patterns ----------------------------------------------------------------------------

def _braces(pattern: str) -> list[str]:
    """``pattern`` with its brace groups expanded, as the shell does: ``{a,b}`` and numeric
    ranges ``{000..099}`` (zero-padded to the width of the bounds)."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numeric = _RANGE.match(body)
    if numeric:
        first, last = numeric.groups()
        width = len(first) if first.lstrip("-").startswith("0") else 0
        step = 1 if int(last) >= int(first) else -1
        choices = [str(i).zfill(width) for i in range(int(first), int(last) + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:
        choices = ["{" + body + "}"]
        head, tail = pattern[:match.end()], pattern[match.end():]
        return [head + rest for rest in _braces(tail)]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [expanded for choice in choices for expanded in _braces(head + choice + tail)]


def expand_shards(shards: Union[PathLike, Iterable[PathLike]], *,
                  storage_options: dict | None = None, must_exist: bool = True) -> list[str]:
    """The files that ``shards`` names, in order: a path or URL, a brace pattern
    (``train-{000..099}.tar``, ``{a,b}``), a glob pattern (sorted matches; a URL pattern is
    listed through fsspec), or a list of any of these. :class:`FileNotFoundError` if a
    pattern matches nothing (or, with ``must_exist``, a named local file is missing).

    >>> expand_shards(["a.tar", "b-{1,2}.tar"], must_exist=False)
    ['a.tar', 'b-1.tar', 'b-2.tar']
    """
    items = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    found: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"shards must be paths, URLs or patterns; got {type(item).__name__} "
                            f"{item!r:.80}")
        for name in _braces(os.fspath(item)):
            found.extend(_matches(name, storage_options, must_exist))
    if not found:
        raise FileNotFoundError(errno.ENOENT, "no file matches", redacted_url(
            os.fspath(shards) if isinstance(shards, (str, os.PathLike)) else str(items)))
    return found


def _matches(name: str, storage_options: dict | None, must_exist: bool) -> list[str]:
    if not any(c in name for c in "*?["):
        if must_exist and not _is_url(name) and not os.path.exists(name):
            raise FileNotFoundError(errno.ENOENT, "no such file", redacted_url(name))
        return [name]
    if _is_url(name):
        from fpipe.remote.urls import glob_urls

        matches = glob_urls(name, storage_options)
    else:
        matches = sorted(path for path in glob.glob(name) if os.path.isfile(path))
    if not matches:
        raise FileNotFoundError(errno.ENOENT, "no file matches the pattern", redacted_url(name))
    return matches


# --- readers of samples that are runs of bytes -------------------------------------------------

class SpanReader(Reader):
    """A reader of one file whose sample ``i`` is the bytes ``starts[i]`` to ``stops[i]``
    (tar members, TFRecord records), decoded by the subclass's ``_decode``.

    Subclasses set ``self.source`` (a :class:`ByteSource`), ``self._starts`` and
    ``self._stops`` (int64 arrays), ``self._keys`` (a :class:`~fpipe.dataset.keyindex.KeyTable`,
    or None for samples numbered ``<file name>:<index>``) and ``self._damage`` (sample index
    -> reason: a sample found broken while the index was built, which raises
    :class:`~fpipe.errors.FormatError` when it is read), and implement
    ``_decode(data, index, offset)``, which raises FormatError for a sample that does not
    decode.
    """

    source: ByteSource
    _starts: np.ndarray
    _stops: np.ndarray
    _keys: KeyTable | None
    _damage: dict[int, str]

    def __len__(self) -> int:
        return len(self._starts)

    def close(self) -> None:
        self.source.close()

    def __contains__(self, key: object) -> bool:
        return self._find(key) >= 0

    def _find(self, key: Any) -> int:
        if self._keys is None:
            return numbered_index(self.source.name, key, len(self))
        return self._keys.find(key)

    def find_index(self, key: Any) -> int:
        found = self._find(key)
        if found < 0:
            raise KeyError(key)
        return found

    def find_key(self, index: int) -> str:
        index = self._index(index)
        return numbered_key(self.source.name, index) if self._keys is None else self._keys[index]

    def _key_list(self, start: int, stop: int) -> list[str]:
        if self._keys is None:
            return numbered_keys(self.source.name, start, stop)
        return self._keys.keys(start, stop)

    def _damaged(self, index: int) -> FormatError:
        return FormatError(self._damage[index], path=self.source.path, index=index,
                           offset=int(self._starts[index]))

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        if type(index) is not int or not 0 <= index < len(self._starts):
            index = self._index(index)
        if self._damage and index in self._damage:
            raise self._damaged(index)
        start, stop = int(self._starts[index]), int(self._stops[index])
        data = self.source.read(start, stop)
        if len(data) != stop - start:
            raise self._truncated(index, start, stop)
        sample = self._decode(data, index, start)
        sample = pack_sample(sample) if raw else sample
        return (self.find_key(index), sample) if yield_key else sample

    def _truncated(self, index: int, start: int, stop: int) -> FormatError:
        return FormatError(f"truncated: the sample ends at byte {stop} but the file has "
                           f"{self.source.size} bytes", path=self.source.path, index=index,
                           offset=start)

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        start, stop, _ = slice(start, stop).indices(len(self))
        return list(self._run(start, stop, yield_key, raw))

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for a, b in _runs(self._starts, self._stops, start, stop, chunk_size):
            yield from self._run(a, b, yield_key, raw)

    def _run(self, start: int, stop: int, yield_key: bool, raw: bool) -> Iterator:
        """Samples ``start`` to ``stop``, cut from one read; a bad sample raises when its turn
        comes, after the good ones before it."""
        if start >= stop:
            return
        starts, stops = self._starts[start:stop].tolist(), self._stops[start:stop].tolist()
        first = starts[0]
        block = memoryview(self.source.read(first, max(stops)))
        keys = self._key_list(start, stop) if yield_key else itertools.repeat(None)
        damage, decode = self._damage, self._decode
        for index, a, b, key in zip(range(start, stop), starts, stops, keys):
            if damage and index in damage:
                raise self._damaged(index)
            piece = block[a - first:b - first]
            if len(piece) != b - a:
                raise self._truncated(index, a, b)
            sample = decode(piece, index, a)
            if raw:
                sample = pack_sample(sample)
            yield (key, sample) if yield_key else sample

    def prefetch(self, indices: Sequence[int]) -> None:
        positions = np.asarray(indices, dtype=np.int64)
        positions = positions[(positions >= 0) & (positions < len(self))]
        if positions.size:
            self.source.prefetch(self._starts[positions])


def _runs(starts: np.ndarray, stops: np.ndarray, start: int, stop: int,
          chunk_size: int) -> Iterator[tuple[int, int]]:
    """Runs of at least ``chunk_size`` consecutive samples (more while they fit in about
    ``_READ_BYTES``), each read at once."""
    a = start
    while a < stop:
        limit = int(starts[a]) + _READ_BYTES
        b = int(np.searchsorted(stops[a:stop], limit, side="right")) + a
        b = min(stop, max(b, a + chunk_size))
        yield a, b
        a = b


# --- writing shards ----------------------------------------------------------------------------

class ShardFiles:
    """The files of a sharded export: shard ``i`` is ``pattern % i`` (``pattern`` holds one
    ``%d``-style field, e.g. ``train-%06d.tar``). Each shard is written in a hidden staging
    folder beside its name, and all are renamed into place together once the last one is
    written (SIGINT and SIGTERM wait until that is done), so a failed or interrupted export
    leaves the shards as they were and nothing of its own. Before the first rename a journal
    (``export.json`` in the staging folder) lists every rename and removal of the commit; a
    process killed in the middle (SIGKILL, power) leaves it, and the next :class:`ShardFiles`
    made for the pattern (so the next export to it) finishes that commit first, with a
    warning naming the staging folder (:func:`finish_export`). Existing files are replaced only
    with ``overwrite``, and a shard that is one of ``inputs`` never. The shards an export
    wrote are listed in its manifest (``.train-%06d.tar.shards.json`` beside them, written
    last); ``overwrite`` removes those of an earlier, longer export that its manifest lists
    and that are as it wrote them, and nothing else (:attr:`left` names the others).

    >>> files = ShardFiles("out-%03d.tar")
    >>> files.name(7), files.manifest
    ('out-007.tar', '.out-%03d.tar.shards.json')
    """

    def __init__(self, pattern: PathLike, overwrite: bool = False,
                 inputs: Iterable[PathLike] = ()) -> None:
        self.pattern, self.overwrite = os.fspath(pattern), overwrite
        try:
            distinct = self.pattern % 0 != self.pattern % 1
        except (TypeError, ValueError):
            distinct = False
        if not distinct:
            raise ValueError(f"pattern must hold one %d-style field for the shard number, as in "
                             f"'train-%06d.tar'; got pattern={self.pattern!r}")
        self.inputs = [os.fspath(path) for path in inputs]
        for folder in finish_export(self.pattern):
            warnings.warn(f"an earlier export to {self.pattern} was killed while it renamed its "
                          f"shards into place; its commit was finished first (from {folder})",
                          stacklevel=2)
        self._refuse_inputs(self._present())
        self.temporaries: list[str] = []
        self.left: list[str] = []
        self._folders: dict[str, str] = {}  # a shard folder -> its staging folder
        self._created: list[str] = []  # shard folders this export made
        self._journal: str | None = None  # the journal of the commit under way

    @property
    def manifest(self) -> str:
        """The path of the manifest: the shards of the last export, with their sizes."""
        folder, name = os.path.split(self.pattern)
        return os.path.join(os.path.dirname(self.name(0)) if "%" in folder else folder,
                            f".{name}.shards.json")

    def name(self, number: int) -> str:
        return self.pattern % number

    def _present(self) -> list[str]:
        """The files that the pattern names now."""
        field = re.search(r"%[-#0 +]*\d*[diouxX]", self.pattern)
        if field is None:
            return []
        wildcard = (glob.escape(self.pattern[:field.start()].replace("%%", "%")) + "*"
                    + glob.escape(self.pattern[field.end():].replace("%%", "%")))
        return glob.glob(wildcard)

    def _refuse_inputs(self, outputs: Iterable[str]) -> None:
        if self.inputs:
            refuse_inputs(outputs, self.inputs)

    def temporary(self) -> str:
        """Where the next shard is written until :meth:`commit`."""
        folder, name = os.path.split(self.name(len(self.temporaries)))
        folder = folder or "."
        if folder not in self._folders:
            self._make_folder(folder)
            self._folders[folder] = tempfile.mkdtemp(prefix=".fpipe-", dir=folder)
        path = os.path.join(self._folders[folder], name)
        self.temporaries.append(path)
        return path

    def _make_folder(self, folder: str) -> None:
        missing = []
        while folder and not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for path in reversed(missing):
            os.mkdir(path)
            self._created.append(path)

    def commit(self) -> list[str]:
        """Rename the shards into place, remove the earlier export's other shards and write
        the manifest; the shard names."""
        names = [self.name(i) for i in range(len(self.temporaries))]
        try:
            if names:
                self._check(names)
                stale = self._stale(names)
                with signals_deferred(done="during the commit, which was finished first: "
                                           f"the {len(names)} new shard(s) are in place, whole"):
                    try:
                        self._rename(names, stale)
                    finally:  # before a held SIGTERM ends the process
                        self.abort()
        finally:
            self.abort()
        if self.left:
            warnings.warn(f"{len(self.left)} file(s) named by the pattern follow the new shards "
                          f"and were left as they are ({', '.join(self.left[:3])}"
                          f"{', ...' if len(self.left) > 3 else ''}): no manifest of an earlier "
                          "export lists them as it wrote them; remove them if they are an "
                          "earlier export's", stacklevel=3)
        return names

    def _check(self, names: list[str]) -> None:
        self._refuse_inputs(names)
        existing = [name for name in names if os.path.lexists(name)]
        if existing and not self.overwrite:
            raise FileExistsError(errno.EEXIST, f"{len(existing)} shard(s) exist; pass "
                                  "-y/--overwrite (overwrite=True) to replace them", existing[0])

    def _stale(self, names: list[str]) -> list[str]:
        """The shards of the earlier export (as its manifest lists them, unchanged since) that
        this one does not replace; the other files past the new ones go to :attr:`left`."""
        if not self.overwrite:
            return []
        earlier = _manifest_shards(self.manifest)
        kept = set(names)
        stale = [name for name, size in earlier.items() if name not in kept
                 and os.path.isfile(name) and os.path.getsize(name) == size]
        self._refuse_inputs(stale)
        number, left = len(names), []
        while os.path.lexists(self.name(number)):
            if self.name(number) not in stale:
                left.append(self.name(number))
            number += 1
        self.left = left
        return stale

    def _rename(self, names: list[str], stale: list[str]) -> None:
        staging = self._folders[os.path.dirname(names[0]) or "."]
        staged = os.path.join(staging, "manifest")
        shards = {os.path.basename(name): os.path.getsize(temporary)
                  for name, temporary in zip(names, self.temporaries)}
        with open(staged, "w", encoding="utf-8") as file:
            json.dump({"pattern": os.path.basename(self.pattern), "shards": shards}, file)
        base = os.path.dirname(self.manifest) or "."

        def relative(path: str) -> str:
            return os.path.relpath(path, base)

        journal = {"pattern": os.path.basename(self.pattern), "manifest": relative(self.manifest),
                   "staged_manifest": relative(staged),
                   "renames": [[relative(t), relative(n)] for t, n in zip(self.temporaries, names)],
                   "remove": [relative(name) for name in stale],
                   "folders": [relative(folder) for folder in self._folders.values()]}
        self._journal = os.path.join(staging, EXPORT_JOURNAL)
        with open(self._journal + ".part", "w", encoding="utf-8") as file:
            json.dump(journal, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(self._journal + ".part", self._journal)  # whole, or not there
        if os.path.lexists(self.manifest):
            os.unlink(self.manifest)  # no manifest while the shards change
        for temporary, name in zip(self.temporaries, names):
            os.replace(temporary, name)
        for name in stale:
            os.unlink(name)
        os.replace(staged, self.manifest)
        os.unlink(self._journal)

    def written(self) -> int:
        """The bytes of the shards written so far."""
        return sum(map(folder_size, self._folders.values()))

    def abort(self) -> None:
        """Remove the staging folders, and the shard folders this export made if empty; not
        when a commit failed midway (its journal is there): the next export finishes it."""
        if self._journal is not None and os.path.exists(self._journal):
            self._folders.clear()
        for folder in self._folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._folders.clear()
        for folder in reversed(self._created):
            try:
                os.rmdir(folder)
            except OSError:
                pass
        self._created.clear()


def _export_journals(folder: str, pattern: str | None = None) -> Iterator[tuple[str, dict]]:
    """The journals (path, contents) of export commits in ``folder`` that did not finish, of
    the shard pattern named ``pattern`` (its file name) or of any."""
    for journal in sorted(glob.glob(os.path.join(glob.escape(folder or "."), ".fpipe-*",
                                                 EXPORT_JOURNAL))):
        try:
            with open(journal, encoding="utf-8") as file:
                contents = json.load(file)
            if pattern is None or contents["pattern"] == pattern:
                yield journal, contents
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours


def finish_export(pattern: PathLike) -> list[str]:
    """Finish the commits of exports to ``pattern`` whose process was killed while it renamed
    the shards into place (SIGKILL, power), from the journals they left in their staging
    folders: the shards were whole before the commit began, so the pattern then holds that
    export whole, and its staging folders are removed. The staging folders finished.

    >>> import tempfile
    >>> finish_export(os.path.join(tempfile.mkdtemp(), "out-%03d.tar"))
    []
    """
    files = ShardFiles.__new__(ShardFiles)
    files.pattern = os.fspath(pattern)
    base = os.path.dirname(files.manifest) or "."
    finished = []
    with signals_deferred():
        for journal, contents in _export_journals(base, os.path.basename(files.pattern)):
            def path(relative: str) -> str:
                return os.path.join(base, relative)
            staged = path(contents["staged_manifest"])
            if os.path.lexists(staged):  # else every rename was done
                if os.path.lexists(path(contents["manifest"])):
                    os.unlink(path(contents["manifest"]))
                for temporary, name in contents["renames"]:
                    if os.path.lexists(path(temporary)):
                        os.replace(path(temporary), path(name))
                for name in contents["remove"]:
                    if os.path.lexists(path(name)):
                        os.unlink(path(name))
                os.replace(staged, path(contents["manifest"]))
            for folder in contents["folders"]:
                if folder != os.path.relpath(os.path.dirname(journal), base):
                    shutil.rmtree(path(folder), ignore_errors=True)
            shutil.rmtree(os.path.dirname(journal), ignore_errors=True)
            finished.append(os.path.dirname(journal))
    return finished


def pending_export(path: PathLike) -> str | None:
    """Why the shard ``path`` cannot be trusted: an export to its pattern was killed while it
    renamed its shards into place, so the pattern holds shards of two exports until the next
    export to it finishes that commit (:func:`finish_export`); None if there is no such
    export.

    >>> import tempfile
    >>> pending_export(os.path.join(tempfile.mkdtemp(), "out-000.tar")) is None
    True
    """
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    for journal, contents in _export_journals(folder):
        try:
            named = {os.path.basename(n) for _, n in contents["renames"]}
            named.update(os.path.basename(n) for n in contents["remove"])
            pattern = contents["pattern"]
        except (KeyError, TypeError, ValueError):
            continue
        if name in named or name == os.path.basename(contents.get("manifest", "")):
            return (f"an export to {os.path.join(folder, pattern)} was killed while it renamed "
                    f"its shards into place (the new ones wait in "
                    f"{os.path.basename(os.path.dirname(journal))}), so the pattern holds shards "
                    f"of two exports; the next 'fpipe export' to that pattern finishes the "
                    f"commit first")
    return None


def _manifest_shards(path: str) -> dict[str, int]:
    """The shards (name: size) that the manifest ``path`` lists, beside it; none without one."""
    try:
        with open(path, encoding="utf-8") as file:
            listed = json.load(file)["shards"]
        folder = os.path.dirname(path)
        return {os.path.join(folder, os.path.basename(name)): int(size)
                for name, size in listed.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_shards(samples: Iterable[dict], pattern: PathLike, open_shard: Callable[[str], Any],
                 shard_size: int | None, shard_bytes: int | None, overwrite: bool,
                 inputs: Iterable[PathLike] = ()) -> list[str]:
    """Write ``samples`` into shards named by ``pattern`` (see :class:`ShardFiles`), starting a
    new shard after ``shard_size`` samples or once a shard holds ``shard_bytes`` bytes.
    ``open_shard(path)`` gives a shard writer: ``write(sample)``, ``size`` (bytes so far),
    ``close()``, and ``discard()`` (close after a failure, writing nothing more). Returns the
    shard names (none for no samples)."""
    files = ShardFiles(pattern, overwrite, inputs)
    shard, count = None, 0
    try:
        for sample in samples:
            if shard is None:
                shard, count = open_shard(files.temporary()), 0
            shard.write(sample)
            count += 1
            if (shard_size is not None and count >= shard_size) or (
                    shard_bytes is not None and shard.size >= shard_bytes):
                shard.close()
                shard = None
        if shard is not None:
            shard.close()
            shard = None
    except BaseException as error:
        written = files.written()
        try:
            if shard is not None:
                shard.discard()
        finally:
            files.abort()
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(error, files.name(len(files.temporaries) - 1), written,
                            f" for the {len(files.temporaries)} shard(s) so far") from error
        raise
    return files.commit()


def renamed(sample: dict, rename: dict[str, str] | None) -> dict:
    """``sample`` with its fields renamed by ``rename`` (old name -> new name)."""
    if not rename:
        return sample
    return {rename.get(name, name): value for name, value in sample.items()}
