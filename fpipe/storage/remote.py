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
fsspec, which is imported only here and only when such a URL is opened. Whole datasets go to
and from URLs through :mod:`fpipe.storage.transfer`.

>>> is_url("s3://bucket/train.msgpack"), is_url("data/train.msgpack")
(True, False)
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import os
import random
import re
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import FormatError, FpipeError, check_integer
from ._blocks import Budget, FileLock, RemoteHandle, write_atomically
from .format import read_md5

__all__ = ["RemoteError", "default_cache_dir", "glob_urls", "is_url"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ONE = struct.Struct(">Q").unpack_from

DEFAULT_BLOCK_SIZE = 4 << 20
DEFAULT_CACHE_LIMIT = 8 << 30
DEFAULT_READ_AHEAD = 8
DEFAULT_RETRIES = 6
DEFAULT_TIMEOUT = 30.0
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


class Retrying:
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
        options = check_options(storage_options)
        self.block_size = check_integer("block_size", _default(block_size, DEFAULT_BLOCK_SIZE), 1)
        limit = check_integer("cache_limit", _default(cache_limit, DEFAULT_CACHE_LIMIT), 1)
        if limit < self.block_size:
            raise ValueError(f"cache_limit must hold at least one block of block_size="
                             f"{self.block_size} bytes; got cache_limit={limit}")
        self.read_ahead = check_integer("read_ahead", _default(read_ahead, DEFAULT_READ_AHEAD), 0)
        retries = check_integer("retries", _default(retries, DEFAULT_RETRIES), 0)
        timeout = _check_timeout(_default(timeout, DEFAULT_TIMEOUT))
        name = basename(url)
        self.source = Retrying(url, options, timeout, retries)
        self.size, tag = self.source.stat()
        root = Path(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir()
        self.budget = Budget(root, limit)
        identity = hashlib.sha256(f"{url}\0{self.size}\0{tag}".encode()).hexdigest()[:24]
        self.folder = root / identity
        self.path = self.folder / name
        (self.folder / "blocks").mkdir(parents=True, exist_ok=True)
        self._fetch_index()

    def __repr__(self) -> str:
        return f"RemoteDataset({self.url!r})"

    def sibling(self, suffix: str) -> Retrying:
        return Retrying(self.url + suffix, self.source.options, self.source.timeout,
                         self.source.retries)

    def _fetch_index(self) -> None:
        complete = self.folder / ".complete"
        if complete.exists():
            return
        with FileLock(self.folder / ".index.lock"):
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
                write_atomically(self.path.with_name(self.path.name + suffix), data)
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

    def handle(self, offsets: Any) -> RemoteHandle:
        """The reader's view of the samples: ``offsets`` (``n + 1`` big-endian uint64)."""
        end = _ONE(offsets, len(offsets) - 8)[0] if len(offsets) >= 8 else 0
        if end != self.size:
            raise FormatError(f"the index ends at byte {end} but the data file has {self.size} "
                              "bytes", path=self.url)
        return RemoteHandle(self, offsets)

    def verify_data(self, expected: str, read_size: int, progress: bool) -> bool:
        """Whether the data at the URL has md5 ``expected`` (streamed, not cached)."""
        from tqdm import tqdm

        md5 = hashlib.md5()
        step = max(read_size, 1 << 22)
        with tqdm(total=self.size, unit="B", unit_scale=True, disable=not progress,
                  desc=basename(self.url)) as bar:
            for start in range(0, self.size, step):
                block = self.source.read(start, min(self.size, start + step))
                md5.update(block)
                bar.update(len(block))
        return md5.hexdigest() == expected


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def check_options(options: Any) -> dict:
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


def basename(url: str) -> str:
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


def glob_urls(pattern: str, storage_options: dict | None = None) -> list[str]:
    """The data files that a URL pattern with wildcards names, sorted (index files and other
    siblings left out); an http(s) URL, or one without wildcards, names itself.

    >>> glob_urls("https://example.org/train.msgpack")
    ['https://example.org/train.msgpack']
    """
    scheme = pattern.split("://", 1)[0].lower()
    if scheme in ("http", "https") or not any(c in pattern for c in "*?["):
        return [pattern]
    fs, _ = filesystem(pattern, storage_options)
    sibling = re.compile(r"\.(offsets|keys|key_hashes|filter|md5|index)$")
    found = [path for path in fs.glob(pattern) if not sibling.search(path)]
    return sorted(fs.unstrip_protocol(path) for path in found)


def filesystem(url: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """The fsspec filesystem that holds ``url``, and the path of ``url`` in it."""
    import fsspec.core  # only in this module, and lazily: ``import fpipe`` must not load it

    return fsspec.core.url_to_fs(url, **check_options(storage_options))
