"""Datasets at URLs: ranged reads through a bounded local block cache shared by processes.

A reader given a URL (``s3://``, ``gs://``, ``https://`` ... anything fsspec knows) fetches
the small index files once, checks them against the ``.md5`` file, and keeps them in the
cache. Sample bytes arrive in *blocks*: runs of consecutive samples of about ``block_size``
bytes, fetched with one ranged request each and kept in ``cache_dir`` under a byte budget
(least recently used blocks go first). The DataLoader workers and ranks of one machine share
the cache: a block is downloaded once (a file lock per block), written beside its name and
renamed into place (so a torn block is never read), and carries a CRC-32 that is checked
when it is opened (a damaged block is fetched again, never decoded).

Failures: every request has a timeout (so a stalled server costs time, never a hang); a
failed, short or mislabelled response is retried with exponential backoff, and after
``retries`` attempts a :class:`RemoteError` names the URL, the samples and the byte range.

``http://`` and ``https://`` URLs are read with the standard library (each response's
``Content-Range`` is checked against the range asked for); every other scheme goes through
fsspec, which is imported only here and only when such a URL is opened.

>>> is_url("s3://bucket/train.msgpack"), is_url("data/train.msgpack")
(True, False)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import http.client
import mmap
import os
import random
import re
import shutil
import struct
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
import zlib
from bisect import bisect_left
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, FpipeError, check_integer
from .format import read_md5

__all__ = ["RemoteError", "SIBLINGS", "Upload", "default_cache_dir", "download_dataset", "glob_urls",
           "is_url"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PAIR = struct.Struct(">QQ").unpack_from
_ONE = struct.Struct(">Q").unpack_from
_CRC = struct.Struct(">I")

DEFAULT_BLOCK_SIZE = 4 << 20
DEFAULT_CACHE_LIMIT = 8 << 30
DEFAULT_READ_AHEAD = 8
DEFAULT_RETRIES = 6
DEFAULT_TIMEOUT = 30.0
# blocks kept mapped in each process (the pages belong to the page cache, not the process)
_MAPPED_BLOCKS = 256
_THREADS = 4
_BACKOFF, _BACKOFF_CAP = 0.05, 5.0
_TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}


class RemoteError(FpipeError, OSError):
    """Bytes of a dataset at a URL could not be fetched, even after the retries.

    >>> str(RemoteError("s3://b/x.msgpack", 0, 100, "HTTP 503", samples=(0, 4)))
    's3://b/x.msgpack: samples 0 to 3, bytes 0 to 100: HTTP 503'
    """

    def __init__(self, url: str, start: int | None, stop: int | None, reason: str,
                 samples: tuple[int, int] | None = None) -> None:
        self.url, self.start, self.stop, self.reason, self.samples = url, start, stop, reason, samples
        where = [f"samples {samples[0]} to {samples[1] - 1}"] if samples else []
        where += [f"bytes {start} to {stop}"] if start is not None else []
        super().__init__(": ".join([url, ", ".join(where), reason] if where else [url, reason]))

    def __reduce__(self) -> tuple:
        return RemoteError, (self.url, self.start, self.stop, self.reason, self.samples)


class _Transient(Exception):
    """A failed attempt worth repeating (a 5xx, a timeout, a short or mislabelled response)."""


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path.

    >>> is_url("https://example.org/a.msgpack"), is_url(b"x"), is_url("C:/data")
    (True, False, False)
    """
    return isinstance(path, str) and bool(_URL.match(path))


def default_cache_dir() -> Path:
    """``$FPIPE_CACHE_DIR``, else ``fpipe/blocks`` in ``$XDG_CACHE_HOME`` (``~/.cache``).

    >>> default_cache_dir().name
    'blocks'
    """
    if os.environ.get("FPIPE_CACHE_DIR"):
        return Path(os.environ["FPIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fpipe" / "blocks"


# --- fetching bytes --------------------------------------------------------------------------

class _HttpFetcher:
    """Ranged GETs with the standard library; ``Content-Range`` must match the request."""

    def __init__(self, url: str, options: dict, timeout: float) -> None:
        unknown = set(options) - {"headers"}
        if unknown:
            raise ValueError(f"http(s) URLs take storage_options {{'headers': ...}} only; got "
                             f"storage_options keys {sorted(unknown)}")
        self.url, self.headers, self.timeout = url, dict(options.get("headers") or {}), timeout

    def stat(self) -> tuple[int, str]:
        response = self._open({}, method="HEAD")
        with response:
            size = response.headers.get("Content-Length")
            tag = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
        if size is None:
            raise _Transient("no Content-Length in the HEAD response")
        return int(size), tag

    def read(self, start: int, stop: int) -> bytes:
        response = self._open({"Range": f"bytes={start}-{stop - 1}"})
        with response:
            if response.status != 206:
                raise _Transient(f"HTTP {response.status} instead of 206 Partial Content")
            answered = response.headers.get("Content-Range", "")
            if not answered.startswith(f"bytes {start}-{stop - 1}/"):
                raise _Transient(f"Content-Range {answered!r} does not match bytes {start}-{stop - 1}")
            return _read_all(response, stop - start, self.timeout)

    def read_whole(self) -> bytes:
        response = self._open({})
        with response:
            size = response.headers.get("Content-Length")
            if response.status != 200 or size is None:
                raise _Transient(f"HTTP {response.status} without a Content-Length")
            return _read_all(response, int(size), self.timeout)

    def _open(self, headers: dict, method: str = "GET") -> Any:
        request = urllib.request.Request(self.url, headers={**self.headers, **headers}, method=method)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)  # http(s) only
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise FileNotFoundError(2, "no such object", self.url) from None
            if error.code in _TRANSIENT_HTTP:
                raise _Transient(f"HTTP {error.code}") from None
            raise OSError(f"{self.url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise _Transient(f"{type(error).__name__}: {error}") from None


def _read_all(response: Any, size: int, timeout: float) -> bytes:
    """Exactly ``size`` bytes of ``response``: a short body or one that trickles past the
    timeout is a failed attempt (a socket timeout alone resets on every byte)."""
    deadline, parts, done = time.monotonic() + timeout, [], 0
    try:
        while done < size:
            part = response.read(min(size - done, 1 << 20))
            if not part:
                raise _Transient(f"short read: {done} of {size} bytes")
            parts.append(part)
            done += len(part)
            if time.monotonic() > deadline:
                raise _Transient(f"stalled: {done} of {size} bytes in {timeout} s")
    except (OSError, http.client.HTTPException) as error:  # IncompleteRead is not an OSError
        raise _Transient(f"{type(error).__name__}: {error!r:.200}") from None
    return b"".join(parts)


class _FsspecFetcher:
    """Ranged reads through an fsspec filesystem (s3fs, gcsfs, ...), each with a timeout."""

    def __init__(self, url: str, options: dict, timeout: float) -> None:
        import fsspec.core  # only here: ``import fpipe`` must not load it

        self.fs, self.path = fsspec.core.url_to_fs(url, **options)
        self.url, self.timeout = url, timeout

    def stat(self) -> tuple[int, str]:
        info = self._call("info", self.path)
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("mtime") or ""
        return int(info["size"]), str(tag)

    def read(self, start: int, stop: int) -> bytes:
        return self._call("cat_file", self.path, start=start, end=stop)

    def read_whole(self) -> bytes:
        return self._call("cat_file", self.path)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        import fsspec.asyn

        try:
            if getattr(self.fs, "async_impl", False):
                method = getattr(self.fs, "_" + name)
                return fsspec.asyn.sync(self.fs.loop, method, *args, timeout=self.timeout, **kwargs)
            return getattr(self.fs, name)(*args, **kwargs)
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except Exception as error:  # botocore, aiohttp and timeouts differ by backend
            raise _Transient(f"{type(error).__name__}: {error}") from error


def _fetcher(url: str, options: dict, timeout: float) -> Any:
    if url.split("://", 1)[0].lower() in ("http", "https"):
        return _HttpFetcher(url, options, timeout)
    return _FsspecFetcher(url, options, timeout)


class _Retrying:
    """A fetcher behind retries with exponential backoff and jitter, and a length check."""

    def __init__(self, url: str, options: dict, timeout: float, retries: int) -> None:
        self.url, self.options, self.timeout, self.retries = url, options, timeout, retries
        self._fetcher: Any = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fetcher": None, "_pid": -1}

    def _target(self) -> Any:
        # a forked worker makes its own: fsspec's event loop thread stays in the parent
        if self._pid != os.getpid():
            self._fetcher, self._pid = _fetcher(self.url, self.options, self.timeout), os.getpid()
        return self._fetcher

    def stat(self) -> tuple[int, str]:
        return self._attempts(lambda: self._target().stat(), None, None, None)

    def read_whole(self) -> bytes:
        """The whole object, with one request (for the small index files)."""
        return self._attempts(lambda: self._target().read_whole(), None, None, None)

    def read(self, start: int, stop: int, samples: tuple[int, int] | None = None) -> bytes:
        def attempt() -> bytes:
            data = self._target().read(start, stop)
            if len(data) != stop - start:
                raise _Transient(f"got {len(data)} bytes instead of {stop - start}")
            return data
        return self._attempts(attempt, start, stop, samples)

    def _attempts(self, attempt: Callable[[], Any], start: int | None, stop: int | None,
                  samples: tuple[int, int] | None) -> Any:
        for tried in range(self.retries + 1):
            try:
                return attempt()
            except _Transient as error:
                if tried == self.retries:
                    raise RemoteError(self.url, start, stop, f"gave up after {tried + 1} attempts; "
                                      f"last: {error}", samples) from error
                delay = min(_BACKOFF_CAP, _BACKOFF * 2 ** tried)
                time.sleep(delay * (0.5 + random.random()))  # jitter spreads the retries
        raise AssertionError("unreachable")


# --- the shared cache ------------------------------------------------------------------------

class _FileLock:
    """An exclusive ``flock`` on a lock file, taken through a descriptor of its own: it excludes
    other processes and the other threads of this one alike (``lockf`` locks belong to the
    process, so its threads would share them, and its deadlock check misfires with threads)."""

    def __init__(self, path: Path) -> None:
        self.path, self._fd = path, -1

    def __enter__(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self._fd)
            raise

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._fd)  # closing the descriptor releases the lock


class _Budget:
    """The byte budget of a cache folder, shared by every process that uses it.

    ``.usage`` holds the bytes of all block files; it changes under a lock on ``.lock``.
    Admitting a block that would pass the limit first deletes the least recently used
    blocks (by modification time, which a reader refreshes when it opens a block).
    """

    def __init__(self, root: Path, limit: int) -> None:
        self.root, self.limit = root, limit
        root.mkdir(parents=True, exist_ok=True)

    def admit(self, size: int) -> None:
        usage_file = self.root / ".usage"
        with _FileLock(self.root / ".lock"):
            try:
                usage = int(usage_file.read_text() or 0)
            except (FileNotFoundError, ValueError):
                usage = self._evict(0)
            if usage + size > self.limit:
                usage = self._evict(size)
            _write_atomically(usage_file, str(usage + size).encode())

    def _evict(self, room: int) -> int:
        """Delete the oldest blocks until ``room`` more bytes fit; the bytes that remain."""
        blocks = []
        for path in self.root.glob("*/blocks/*"):
            if not path.name.startswith("."):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                blocks.append((stat.st_mtime_ns, stat.st_size, path))
        blocks.sort()
        total = sum(size for _, size, _ in blocks)
        for _, size, path in blocks:
            if total + room <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
        return total


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


# --- a dataset at a URL ----------------------------------------------------------------------

_INDEX_SUFFIXES = (".offsets", ".keys", ".key_hashes", ".filter")


class RemoteDataset:
    """The index files of the dataset at ``url``, fetched once into the cache and checked, and
    the settings to fetch its samples; :meth:`handle` gives the reader its bytes.

    ``path`` is the local stand-in for the data file: the index files sit beside it under
    their usual names (the data file itself is never there). Pickles by its settings.
    """

    def __init__(self, url: str, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None,
                 block_size: int | None = None, read_ahead: int | None = None,
                 retries: int | None = None, timeout: float | None = None) -> None:
        self.url = url
        options = _check_options(storage_options)
        self.block_size = check_integer("block_size", _default(block_size, DEFAULT_BLOCK_SIZE), 1)
        limit = check_integer("cache_limit", _default(cache_limit, DEFAULT_CACHE_LIMIT), 1)
        if limit < self.block_size:
            raise ValueError(f"cache_limit must hold at least one block of block_size="
                             f"{self.block_size} bytes; got cache_limit={limit}")
        self.read_ahead = check_integer("read_ahead", _default(read_ahead, DEFAULT_READ_AHEAD), 0)
        retries = check_integer("retries", _default(retries, DEFAULT_RETRIES), 0)
        timeout = _check_timeout(_default(timeout, DEFAULT_TIMEOUT))
        name = _basename(url)
        self.source = _Retrying(url, options, timeout, retries)
        self.size, tag = self.source.stat()
        root = Path(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir()
        self.budget = _Budget(root, limit)
        identity = hashlib.sha256(f"{url}\0{self.size}\0{tag}".encode()).hexdigest()[:24]
        self.folder = root / identity
        self.path = self.folder / name
        (self.folder / "blocks").mkdir(parents=True, exist_ok=True)
        self._fetch_index()

    def __repr__(self) -> str:
        return f"RemoteDataset({self.url!r})"

    def sibling(self, suffix: str) -> _Retrying:
        return _Retrying(self.url + suffix, self.source.options, self.source.timeout,
                         self.source.retries)

    def _fetch_index(self) -> None:
        complete = self.folder / ".complete"
        if complete.exists():
            return
        with _FileLock(self.folder / ".index.lock"):
            if complete.exists():
                return
            for attempt in range(2):  # a mismatch is fetched once more before it is an error
                fetched = self._fetch_index_files()
                bad = _mismatched(self.path, fetched)
                if not bad:
                    break
                if attempt:
                    sibling = self.url + bad[len(self.path.name):]
                    raise FormatError(f"{bad} does not match the md5 file", path=sibling)
            complete.write_bytes(b"")

    def _fetch_index_files(self) -> list[str]:
        suffixes = (".md5", *_INDEX_SUFFIXES)
        # side by side: against a far-away server, one round trip for all of them
        with concurrent.futures.ThreadPoolExecutor(len(suffixes)) as pool:
            contents = list(pool.map(self._fetch_sibling, suffixes))
        fetched = []
        for suffix, data in zip(suffixes, contents):
            if data is not None:
                _write_atomically(self.path.with_name(self.path.name + suffix), data)
                fetched.append(suffix)
        if ".offsets" not in fetched:  # a legacy .index needs the data file's size to be read
            raise FileNotFoundError(2, "dataset offsets not found (a URL needs the .offsets file; "
                                    "datasets with only a legacy .index are read locally)",
                                    self.url + ".offsets")
        return [self.path.name + suffix for suffix in fetched]

    def _fetch_sibling(self, suffix: str) -> bytes | None:
        try:
            return self.sibling(suffix).read_whole()
        except FileNotFoundError:
            return None

    def handle(self, offsets: Any) -> _RemoteHandle:
        """The reader's view of the samples: ``offsets`` (``n + 1`` big-endian uint64)."""
        end = _ONE(offsets, len(offsets) - 8)[0] if len(offsets) >= 8 else 0
        if end != self.size:
            raise FormatError(f"the index ends at byte {end} but the data file has {self.size} "
                              "bytes", path=self.url)
        return _RemoteHandle(self, offsets)

    def verify_data(self, expected: str, read_size: int, progress: bool) -> bool:
        """Whether the data at the URL has md5 ``expected`` (streamed, not cached)."""
        from tqdm import tqdm

        md5 = hashlib.md5()
        step = max(read_size, 1 << 22)
        with tqdm(total=self.size, unit="B", unit_scale=True, disable=not progress,
                  desc=_basename(self.url)) as bar:
            for start in range(0, self.size, step):
                block = self.source.read(start, min(self.size, start + step))
                md5.update(block)
                bar.update(len(block))
        return md5.hexdigest() == expected


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _check_options(options: Any) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"storage_options must be a dict; got storage_options={options!r:.80}")
    return dict(options)


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds; got timeout={timeout!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds; got timeout={timeout!r}")
    return float(timeout)


def _basename(url: str) -> str:
    name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]
    if not name:
        raise ValueError(f"the URL must name a data file; got {url!r}")
    return name


def _mismatched(path: Path, fetched: list[str]) -> str | None:
    """The first fetched index file whose md5 differs from the ``.md5`` entry, if any."""
    if path.name + ".md5" not in fetched:
        return None
    entries = read_md5(path)
    for name in fetched:
        if name in entries:
            digest = hashlib.md5(path.with_name(name).read_bytes()).hexdigest()
            if digest != entries[name]:
                return name
    return None


# --- blocks ----------------------------------------------------------------------------------

class _Block:
    """Bytes ``start`` to ``stop`` of the data file, samples ``first`` to ``last - 1``; ``view``
    is the mapped cache file (its last four bytes are the CRC-32)."""

    __slots__ = ("first", "last", "start", "stop", "view")

    def __init__(self, start: int, stop: int, first: int, last: int) -> None:
        self.start, self.stop, self.first, self.last = start, stop, first, last
        self.view: Any = None


class _Starts:
    """The start offsets of the samples as a sequence, for :func:`bisect.bisect_left`."""

    def __init__(self, offsets: Any, n: int) -> None:
        self.offsets, self.n = offsets, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return _ONE(self.offsets, 8 * index)[0]


class _Bytes:
    """The data file as something to slice, like the map of a local file: ``bytes[a:b]``
    comes from the cached block that holds it (fetched first if need be)."""

    def __init__(self, handle: _RemoteHandle) -> None:
        self._handle, self._views = handle, handle.views
        self._block_size, self._size = handle.block_size, handle.size

    def __getitem__(self, key: slice) -> bytes:
        # the common case first, in as few steps as can be: it runs once a sample
        start, stop = key.start, key.stop
        found = self._views.get(start // self._block_size)
        if found is not None and found[0] <= start and stop <= found[1]:
            return found[2][start - found[0]:stop - found[0]]
        return self._slow(start, min(stop, self._size))

    def _slow(self, start: int, stop: int) -> bytes:
        if start >= stop:
            return b""
        block = self._handle.load(start // self._block_size)
        if block is not None and block.start <= start and stop <= block.stop:
            return block.view[start - block.start:stop - block.start]
        return self._handle.gather(start, stop)


class _RemoteHandle:
    """One process's view of the samples of a :class:`RemoteDataset`, with the interface of
    the reader's local file handle (``fd`` None, ``offsets``, ``size``, ``read``,
    ``offsets_between``, ``offset_range``, ``changed``) and read-ahead (:meth:`prefetch`).
    Cached blocks are checked (length and CRC-32) before they are used, and cache files are
    replaced whole, never changed in place, so a sample never comes from a changed file."""

    fd = None

    def __init__(self, dataset: RemoteDataset, offsets: Any) -> None:
        self.dataset, self.offsets, self.size = dataset, offsets, dataset.size
        self.block_size, self.n = dataset.block_size, len(offsets) // 8 - 1
        self.blocks: dict[int, _Block] = {}
        self.views: dict[int, tuple[int, int, Any]] = {}  # the blocks' (start, stop, view)
        self.map = self.data = _Bytes(self)
        self._spans: dict[int, _Block | None] = {}
        self._reset_threads()

    def _reset_threads(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._inflight: dict[int, concurrent.futures.Future] = {}
        self.ready: dict[int, _Block] = {}
        self._ahead = _ReadAhead(self)

    def _own(self) -> None:
        # locks taken by threads of the parent are never released in a forked child
        if self._pid != os.getpid():
            self.blocks.clear()
            self.views.clear()
            self._reset_threads()

    def read(self, start: int, stop: int) -> bytes:
        return self.map[start:stop]

    def resident_offsets(self, path: Path) -> Any:
        return self.offsets

    def offsets_between(self, start: int, stop: int, path: Path) -> tuple[int, ...]:
        return struct.unpack(f">{stop - start + 1}Q", self.offsets[8 * start:8 * (stop + 1)])

    def check_unchanged(self, path: Path, index: int, offset: int) -> None:
        """Nothing to check: see the class docstring."""

    def changed(self, error: Any) -> None:
        """None: a cached block cannot change under its reader (see the class docstring)."""
        return None

    def offset_range(self, start: int, stop: int, path: Path) -> tuple[tuple[int, ...], int]:
        count = stop - start + 1
        data = self.offsets[8 * start:8 * (stop + 1)]
        values = np.frombuffer(data, dtype=">u8")
        drops = np.flatnonzero(values[1:] < values[:-1])
        return struct.unpack(f">{count}Q", data), int(drops[0]) + 1 if drops.size else count

    def span(self, number: int) -> _Block | None:
        """Block ``number``: the samples whose first byte lies in
        ``[number * block_size, (number + 1) * block_size)``; None if no sample starts there."""
        block = self._spans.get(number, False)
        if block is False:
            starts = _Starts(self.offsets, self.n)
            first = bisect_left(starts, number * self.block_size)
            last = bisect_left(starts, (number + 1) * self.block_size, first)
            block = None
            if first < last:
                start, stop = _ONE(self.offsets, 8 * first)[0], _ONE(self.offsets, 8 * last)[0]
                block = _Block(start, min(stop, self.size), first, last)
            self._spans[number] = block
        return block

    def gather(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` across blocks; bytes no block holds (only where the index is
        damaged) are fetched directly."""
        parts = []
        while start < stop:
            block = self.load(start // self.block_size)
            if block is None or not block.start <= start < block.stop:
                parts.append(self.dataset.source.read(start, stop))
                break
            end = min(stop, block.stop)
            parts.append(block.view[start - block.start:end - block.start])
            start = end
        return b"".join(parts)

    def load(self, number: int, ahead: bool = False) -> _Block | None:
        """Block ``number``, mapped: from this process, the cache, or the network. Blocks
        loaded ``ahead`` wait in ``ready`` until the reader asks for them (which tells the
        read-ahead how far the reader has come)."""
        self._own()
        if not ahead:
            self._ahead.consumed(number)
        with self._mutex:
            block = self.blocks.get(number) or (None if ahead else self.ready.pop(number, None))
            if block is not None or (ahead and number in self.ready):
                if not ahead:
                    self._keep(number, block)
                return block
            future = self._inflight.get(number)
            owner = future is None
            if owner:
                future = self._inflight[number] = concurrent.futures.Future()
        if not owner:
            return future.result()
        try:
            block = self._obtain(number)
        except BaseException as error:
            with self._mutex:
                self._inflight.pop(number, None)
            future.set_exception(error)
            raise
        with self._mutex:
            self._inflight.pop(number, None)
            if block is not None:
                if ahead:
                    self.ready[number] = block
                else:
                    self._keep(number, block)
        future.set_result(block)
        return block

    def span_count(self) -> int:
        """One more than the number of the last block."""
        return _ONE(self.offsets, 8 * (self.n - 1))[0] // self.block_size + 1 if self.n else 0

    def _keep(self, number: int, block: _Block) -> None:
        if len(self.blocks) >= _MAPPED_BLOCKS:
            oldest = next(iter(self.blocks))
            self.views.pop(oldest, None)
            self.blocks.pop(oldest)
        self.blocks[number] = block
        self.views[number] = (block.start, block.stop, block.view)

    def _obtain(self, number: int) -> _Block | None:
        span = self.span(number)
        if span is None:
            return None
        path = self.dataset.folder / "blocks" / str(number)
        block = _open_cached(path, span)
        if block is None:
            with _FileLock(path.with_name(f".{number}.lock")):
                block = _open_cached(path, span) or self._download(path, span)
        return block

    def _download(self, path: Path, span: _Block) -> _Block:
        data = self.dataset.source.read(span.start, span.stop, (span.first, span.last))
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(temporary, "wb+") as file:
            file.write(data)
            file.write(_CRC.pack(zlib.crc32(data)))
            file.flush()
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.dataset.budget.admit(len(data) + _CRC.size)
        os.replace(temporary, path)
        return _mapped(span, view)

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Fetch, in the background, the blocks that samples ``indices`` (in the order they
        will be read) need; a new call replaces the plan of the last."""
        self._own()
        if self.dataset.read_ahead and len(self.blocks) < self.span_count():
            self._ahead.plan(self._first_blocks(indices))

    def _first_blocks(self, indices: Sequence[int] | np.ndarray) -> list[int]:
        """The blocks of ``indices`` in the order of first need, without those at hand."""
        positions = np.asarray(indices, dtype=np.int64)
        positions = positions[(positions >= 0) & (positions < self.n)]
        if not positions.size:
            return []
        starts = np.frombuffer(self.offsets, dtype=">u8", count=self.n)[positions]
        numbers = (starts // self.block_size).astype(np.int64)
        unique, first = np.unique(numbers, return_index=True)
        return [n for n in unique[np.argsort(first)].tolist() if n not in self.blocks]


def _mapped(span: _Block, view: Any) -> _Block:
    block = _Block(span.start, span.stop, span.first, span.last)
    block.view = view
    return block


def _open_cached(path: Path, span: _Block) -> _Block | None:
    """The cached block at ``path``, mapped, if it is whole and its CRC matches; a damaged
    one is deleted (then fetched again)."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size != span.stop - span.start + _CRC.size:
                raise ValueError("wrong length")
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None
    except ValueError:
        path.unlink(missing_ok=True)
        return None
    body = memoryview(view)[:-_CRC.size]
    intact = zlib.crc32(body) == _CRC.unpack_from(view, size - _CRC.size)[0]
    body.release()
    if not intact:
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # the budget evicts the least recently opened blocks first
    except FileNotFoundError:
        pass
    return _mapped(span, view)


class _ReadAhead:
    """Background threads (at most ``_THREADS``) fetching the blocks of a plan, at most
    ``read_ahead`` blocks past the last one the reader asked for. Without a plan, a reader
    that asks for block ``k`` right after ``k - 1`` gets the blocks after ``k`` planned."""

    def __init__(self, handle: _RemoteHandle) -> None:
        self.handle, self.limit = handle, handle.dataset.read_ahead
        self.cond = threading.Condition()
        self.order: Sequence[int] = []
        self.where: dict[int, int] = {}  # a block's place in a listed order (not a range)
        self.next = self.reached = self.workers = 0
        self.last = -2

    def plan(self, order: Sequence[int]) -> None:
        """Fetch the blocks ``order`` (a list, or a range for reading in file order) ahead."""
        with self.cond:
            self.order = order
            self.where = {} if isinstance(order, range) else {n: i for i, n in enumerate(order)}
            self.next = self.reached = 0
            self.handle.ready.clear()
            self._start()
            self.cond.notify_all()

    def _position(self, number: int) -> int | None:
        if isinstance(self.order, range):
            return number - self.order.start if number in self.order else None
        return self.where.get(number)

    def consumed(self, number: int) -> None:
        if not self.limit:
            return
        with self.cond:
            position = self._position(number)
            sequential, self.last = number == self.last + 1, number
            if position is None and sequential and number not in self.handle.blocks:
                self.plan(range(number + 1, self.handle.span_count()))
            elif position is not None and position + 1 > self.reached:
                self.reached = position + 1
                self._start()
                self.cond.notify_all()

    def _start(self) -> None:
        while self.workers < min(_THREADS, self.limit) and self.next < len(self.order):
            self.workers += 1
            threading.Thread(target=self._work, name="fpipe-read-ahead", daemon=True).start()

    def _work(self) -> None:
        while (number := self._take()) is not None:
            try:
                self.handle.load(number, ahead=True)
            except Exception:  # the reader's own request for the block reports it
                continue

    def _take(self) -> int | None:
        with self.cond:
            while self.next < len(self.order):
                if self.next < self.reached + self.limit:
                    self.next += 1
                    return self.order[self.next - 1]
                if not self.cond.wait(timeout=5.0):  # idle: the reader stopped reading
                    break
            self.workers -= 1
            return None


def glob_urls(pattern: str, storage_options: dict | None = None) -> list[str]:
    """The data files that a URL pattern with wildcards names, sorted (index files and other
    siblings left out); an http(s) URL, or one without wildcards, names itself.

    >>> glob_urls("https://example.org/train.msgpack")
    ['https://example.org/train.msgpack']
    """
    scheme = pattern.split("://", 1)[0].lower()
    if scheme in ("http", "https") or not any(c in pattern for c in "*?["):
        return [pattern]
    import fsspec.core

    fs, _ = fsspec.core.url_to_fs(pattern, **_check_options(storage_options))
    sibling = re.compile(r"\.(offsets|keys|key_hashes|filter|md5|index)$")
    found = [path for path in fs.glob(pattern) if not sibling.search(path)]
    return sorted(fs.unstrip_protocol(path) for path in found)


# --- writing to a URL ------------------------------------------------------------------------

# Every file a dataset may have besides its data file, in upload order: ``.offsets`` goes
# last, because a reader needs it to open the dataset, so the dataset appears only when whole.
SIBLINGS = (".keys", ".key_hashes", ".filter", ".classes.json", ".md5", ".offsets")
_UPLOAD_TRIES = 3


class Upload:
    """A dataset bound for ``url``: written locally in a staging folder (``path`` is its data
    file there), then uploaded file by file by :meth:`commit`.

    The data and index files go first and ``.offsets`` last; a reader needs ``.offsets`` to open
    a dataset, and an overwritten dataset loses its old ``.offsets`` before anything else
    changes, so the name never holds a dataset made of two writes. If an upload fails, the files
    already sent are deleted again. The staging folder (in the system's temporary folder, see
    :func:`tempfile.gettempdir`) is removed either way.

    >>> Upload("https://example.org/x.msgpack")
    Traceback (most recent call last):
    ...
    ValueError: fpipe writes to object storage (s3://, gs://, ...), not to http(s) URLs; got 'https://example.org/x.msgpack'
    """

    def __init__(self, url: str, storage_options: dict | None = None, overwrite: bool = False) -> None:
        if url.split("://", 1)[0].lower() in ("http", "https"):
            raise ValueError("fpipe writes to object storage (s3://, gs://, ...), not to http(s) "
                             f"URLs; got {url!r}")
        import fsspec.core

        name = _basename(url)
        self.url = url
        self.fs, self._remote = fsspec.core.url_to_fs(url, **_check_options(storage_options))
        existing = [suffix for suffix in ("", *SIBLINGS) if self.fs.exists(self._remote + suffix)]
        if existing and not overwrite:
            raise FileExistsError(17, "dataset exists (pass overwrite=True to replace it)",
                                  url + existing[0])
        self.folder = Path(tempfile.mkdtemp(prefix="fpipe-upload-"))
        self.path = self.folder / name
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)

    def commit(self, progress: bool = False, source: Path | None = None) -> None:
        """Upload the staged files (or the dataset whose data file is ``source``), ``.offsets``
        last, then remove the staging folder."""
        data = self.path if source is None else Path(source)
        try:
            local = [("", data)] + [(s, data.with_name(data.name + s)) for s in SIBLINGS]
            local = [(suffix, path) for suffix, path in local if path.exists()]
            self._retry(self._remove, ".offsets")
            self._upload(local, progress)
            for suffix in sorted(set(SIBLINGS) - {suffix for suffix, _ in local}):
                self._retry(self._remove, suffix)
        finally:
            self.abort()

    def abort(self) -> None:
        """Remove the staging folder; nothing is uploaded."""
        self._cleanup()

    def _upload(self, local: list[tuple[str, Path]], progress: bool) -> None:
        from tqdm import tqdm

        sent = []
        total = sum(path.stat().st_size for _, path in local)
        with tqdm(total=total, unit="B", unit_scale=True, disable=not progress,
                  desc=_basename(self.url)) as bar:
            try:
                for suffix, path in local:
                    self._retry(self.fs.put_file, str(path), self._remote + suffix)
                    sent.append(suffix)
                    bar.update(path.stat().st_size)
            except BaseException:
                for suffix in reversed(sent):  # best effort: without .offsets it is no dataset
                    with contextlib.suppress(Exception):
                        self.fs.rm(self._remote + suffix)
                raise

    def _remove(self, suffix: str) -> None:
        """Delete the dataset's file ``suffix`` at the URL, if it is there."""
        if self.fs.exists(self._remote + suffix):
            self.fs.rm(self._remote + suffix)

    def _retry(self, call: Callable[..., Any], *args: Any) -> Any:
        for tried in range(_UPLOAD_TRIES):
            try:
                return call(*args)
            except (FileNotFoundError, PermissionError):
                raise
            except Exception as error:  # botocore and aiohttp errors differ by backend
                if tried + 1 == _UPLOAD_TRIES:
                    raise RemoteError(self.url, None, None, f"upload failed after {tried + 1} "
                                      f"attempts; last: {type(error).__name__}: {error}") from error
                time.sleep(_BACKOFF * 4 ** tried)
        raise AssertionError("unreachable")


def download_dataset(url: str, path: Path, storage_options: dict | None = None,
                     progress: bool = False) -> list[Path]:
    """Fetch every file of the dataset at ``url`` to data file ``path`` and its siblings (with
    retries, in ranges of 8 MiB); the files written. ``.offsets`` must be there: without it
    the URL holds no whole dataset.
    """
    from tqdm import tqdm

    options = _check_options(storage_options)
    sources = [(suffix, _Retrying(url + suffix, options, DEFAULT_TIMEOUT, DEFAULT_RETRIES))
               for suffix in ("", *SIBLINGS)]
    sizes = {}
    for suffix, source in sources:
        try:
            sizes[suffix] = source.stat()[0]
        except FileNotFoundError:
            if suffix in ("", ".offsets"):
                raise FileNotFoundError(2, "no dataset at the URL (need the data file and "
                                        ".offsets)", url + suffix) from None
    written = []
    with tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, disable=not progress,
              desc=_basename(url)) as bar:
        for suffix, source in sources:
            if suffix in sizes:
                target = path.with_name(path.name + suffix)
                _fetch_file(source, sizes[suffix], target, bar)
                written.append(target)
    return written


def _fetch_file(source: _Retrying, size: int, target: Path, bar: Any) -> None:
    step = 8 << 20
    with open(target, "wb") as file:
        for start in range(0, size, step):
            block = source.read(start, min(size, start + step))
            file.write(block)
            bar.update(len(block))
