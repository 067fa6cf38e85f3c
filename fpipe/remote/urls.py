"""Datasets at URLs: ranged reads through a bounded local block cache shared by processes.

A reader given a URL (``s3://``, ``gs://``, ``https://`` ... anything fsspec knows) fetches
the small index files once, checks them against the ``.md5`` file, and keeps them in the
cache. Sample bytes arrive in *blocks*: runs of consecutive samples of about ``block_size``
bytes, fetched with one ranged request each and kept in ``cache_dir`` under a byte budget
(least recently used blocks go first). The DataLoader workers and ranks of one machine share
the cache: a block is downloaded once (under a file lock), written beside its name and
renamed into place (so a torn block is never read), and carries a CRC-32 that is checked
when it is opened (a damaged block is fetched again, never decoded). What in the cache folder
is the cache's, and how it treats the rest: the guide "Datasets in object storage".

Sizes are claims: every download is bounded by what the format allows (the data file's size,
and the number of samples that ``.offsets`` gives), streamed to disk, and a server that claims
or sends more is refused with a :class:`RemoteError`.

Failures: every request has a timeout (so a stalled server costs time, never a hang); a
failed, short or mislabelled response is retried with exponential backoff (the first retry is
logged on the ``fpipe.remote`` logger), and after ``retries`` attempts a :class:`RemoteError`
names the URL, the samples and the byte range. A failure that another attempt cannot heal
(missing or refused credentials, an invalid request, a 4xx answer other than 408 and 429)
is a :class:`RemoteError` at once, with a hint of what to set.

Credentials never appear in a message or a repr: the user information of a URL and every
value of ``storage_options`` are hidden. An ``http(s)://``
URL with ``user:password@`` logs in with HTTP basic authentication; object storage URLs
(``s3://``, ``gs://`` ...) cannot carry credentials and are refused with a hint.

``http://`` and ``https://`` URLs are read with the standard library (each response's
``Content-Range`` is checked against the range asked for); every other scheme goes through
fsspec, which is imported only here and only when such a URL is opened. Whole datasets go to
and from URLs through :mod:`fpipe.remote.transfer`.

>>> is_url("s3://bucket/train.msgpack"), is_url("data/train.msgpack")
(True, False)
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.client
import logging
import math
import os
import random
import re
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from fpipe.errors import (
    FormatError,
    FpipeError,
    Secrets,
    check_integer,
    query_secrets,
    redacted_options,
    redacted_url,
)
from fpipe.files import read_md5
from fpipe.remote.cache import (
    Budget,
    FileLock,
    RemoteHandle,
    dataset_folder,
    replacing,
    write_atomically,
)

__all__ = ["RemoteError", "RemoteOptions", "beside_url", "default_cache_dir", "glob_urls", "is_url",
           "read_whole", "sibling_url", "size_bound", "split_query"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ONE = struct.Struct(">Q").unpack_from
_LOG = logging.getLogger("fpipe.remote")

DEFAULT_BLOCK_SIZE = 4 << 20
DEFAULT_CACHE_BYTES = 8 << 30
DEFAULT_READ_AHEAD = 8
DEFAULT_RETRIES = 10  # about 20 s of backoff in all: a brief outage costs time, not the run
DEFAULT_TIMEOUT = 30.0
_BACKOFF, _BACKOFF_CAP = 0.05, 5.0
_TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
_STEP = 8 << 20  # whole files come in ranges of this many bytes (fsspec), or stream (http)
# fsspec's filesystems that log in with a URL's user information; for the others (s3, gs ...)
# it would be read as part of the bucket's name
_USERINFO_SCHEMES = {"ftp", "sftp", "ssh", "smb", "webhdfs", "hdfs"}
_CREDENTIALS_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
          "storage_options={'key': ..., 'secret': ...}",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a key file, or pass storage_options={'token': ...}",
    "http": "put user:password@ in the URL, or pass storage_options={'headers': "
            "{'Authorization': ...}}",
}
_SCHEME_FAMILIES = {"s3a": "s3", "gcs": "gs", "https": "http"}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "DefaultCredentialsError", "RefreshError"}
_INVALID = {"ParamValidationError", "NoRegionError", "InvalidRegionError", "ValidationError"}
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"}


@dataclass(frozen=True, eq=False)
class RemoteOptions:
    """How a reader reads a file at a URL: every reader (:class:`~fpipe.dataset.MsgpackReader`,
    :class:`~fpipe.dataset.ShardedReader`, the readers of ``fpipe.formats``) takes them the
    same way, as ``remote=RemoteOptions(...)``. Each option left at None takes its default.

    - ``storage_options``: a dict for fsspec (credentials, endpoint); never shown in a message
      or a repr;
    - ``cache_dir``: the folder of the block cache (default :func:`default_cache_dir`);
    - ``cache_bytes``: the most bytes the block cache keeps on disk (8 GiB);
    - ``block_size``: bytes fetched per ranged request (4 MiB);
    - ``read_ahead``: blocks fetched ahead of the order being read (8);
    - ``retries``: attempts after a failed request (10); ``timeout``: seconds per request (30).

    Values are checked when the options are made, so a bad one is an error before any reader
    opens anything; an unknown option is a TypeError.

    >>> RemoteOptions(cache_bytes=1 << 30, storage_options={"key": "me", "secret": "pw"})
    RemoteOptions(storage_options={'key': '***', 'secret': '***'}, cache_bytes=1073741824)
    >>> RemoteOptions(cache_limit=1 << 30)
    Traceback (most recent call last):
    ...
    TypeError: RemoteOptions.__init__() got an unexpected keyword argument 'cache_limit'
    """

    storage_options: Mapping | None = None
    cache_dir: str | os.PathLike | None = None
    cache_bytes: int | None = None
    block_size: int | None = None
    read_ahead: int | None = None
    retries: int | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        check_options(self.storage_options)
        block_size = check_integer("block_size", _default(self.block_size, DEFAULT_BLOCK_SIZE), 1)
        cache_bytes = check_integer("cache_bytes", _default(self.cache_bytes, DEFAULT_CACHE_BYTES), 1)
        if cache_bytes < block_size:
            raise ValueError(f"cache_bytes must hold at least one block of block_size="
                             f"{block_size} bytes; got cache_bytes={cache_bytes}")
        check_integer("read_ahead", _default(self.read_ahead, DEFAULT_READ_AHEAD), 0)
        check_integer("retries", _default(self.retries, DEFAULT_RETRIES), 0)
        check_timeout(_default(self.timeout, DEFAULT_TIMEOUT))

    def __repr__(self) -> str:
        shown = [f"{name}={redacted_options(value) if name == 'storage_options' else repr(value)}"
                 for name, value in self.given().items()]
        return f"RemoteOptions({', '.join(shown)})"

    def given(self) -> dict[str, Any]:
        """The options that are set (not None), by name.

        >>> RemoteOptions(retries=2).given()
        {'retries': 2}
        """
        return {item.name: getattr(self, item.name) for item in fields(self)
                if getattr(self, item.name) is not None}

    @property
    def settings(self) -> tuple[int, int, int, int, float]:
        """``block_size``, ``cache_bytes``, ``read_ahead``, ``retries`` and ``timeout``, with
        the defaults filled in."""
        return (_default(self.block_size, DEFAULT_BLOCK_SIZE),
                _default(self.cache_bytes, DEFAULT_CACHE_BYTES),
                _default(self.read_ahead, DEFAULT_READ_AHEAD),
                _default(self.retries, DEFAULT_RETRIES),
                float(_default(self.timeout, DEFAULT_TIMEOUT)))


#: The keywords readers took before :class:`RemoteOptions`, and the option each became.
MOVED_OPTIONS = {"storage_options": "storage_options", "cache_dir": "cache_dir",
                 "cache_limit": "cache_bytes", "block_size": "block_size",
                 "read_ahead": "read_ahead", "retries": "retries", "timeout": "timeout"}


def check_remote(remote: Any) -> RemoteOptions:
    """``remote`` (None or :class:`RemoteOptions`) as RemoteOptions; a TypeError otherwise.

    >>> check_remote(None)
    RemoteOptions()
    """
    if remote is None:
        return RemoteOptions()
    if not isinstance(remote, RemoteOptions):
        raise TypeError(f"remote must be a RemoteOptions; got {type(remote).__name__}")
    return remote


def takes_remote(init: Callable) -> Callable:
    """``init``, the ``__init__`` of a reader that takes ``remote=RemoteOptions(...)``, made to
    refuse the keywords that the options of a URL used to be (``cache_limit=`` ...) with a
    TypeError saying what replaces them, before anything is opened. The signature stays
    ``init``'s.

    >>> class Reader:
    ...     @takes_remote
    ...     def __init__(self, path, *, remote=None):
    ...         self.remote = check_remote(remote)
    >>> Reader("s3://b/x.msgpack", cache_limit=1 << 30)
    Traceback (most recent call last):
    ...
    TypeError: Reader got an unexpected keyword argument 'cache_limit': the options of a URL \
are now one value, remote=RemoteOptions(cache_bytes=...) (from fpipe.remote import RemoteOptions)
    """
    import functools
    import inspect

    accepted = set(inspect.signature(init).parameters)

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name in MOVED_OPTIONS and name not in accepted:
                raise TypeError(f"{type(self).__name__} got an unexpected keyword argument "
                                f"{name!r}: the options of a URL are now one value, remote="
                                f"RemoteOptions({MOVED_OPTIONS[name]}=...) (from fpipe.remote "
                                "import RemoteOptions)")
        init(self, *args, **kwargs)
    return checked


def refuse_remote_options(path: Any, remote: RemoteOptions | None, allowed: tuple = ()) -> None:
    """Raise ValueError naming the options of ``remote`` that are set, which only apply to
    URLs, for the local ``path`` (secrets redacted), but those ``allowed``.

    >>> refuse_remote_options("x.msgpack", RemoteOptions(retries=2))
    Traceback (most recent call last):
    ...
    ValueError: remote=RemoteOptions(retries=2) only applies to URLs; got the local path 'x.msgpack'
    """
    given = {name: value for name, value in (remote.given() if remote else {}).items()
             if name not in allowed}
    if given:
        raise ValueError(f"remote={RemoteOptions(**given)!r} only applies to URLs; got the "
                         f"local path {path!r}")


class RemoteError(FpipeError, OSError):
    """Bytes of a dataset at a URL could not be fetched: after the retries, or at once when
    another attempt cannot help. The URL's user information is never part of it.

    >>> str(RemoteError("s3://b/x.msgpack", 0, 100, "HTTP 503", samples=(0, 4)))
    's3://b/x.msgpack: samples 0 to 3, bytes 0 to 100: HTTP 503'
    >>> RemoteError("https://ann:pw@example.org/x", None, None, "HTTP 500").url
    'https://***@example.org/x'
    """

    def __init__(self, url: str, start: int | None, stop: int | None, reason: str,
                 samples: tuple[int, int] | None = None) -> None:
        url, reason = redacted_url(url), redacted_url(reason)
        self.url, self.start, self.stop, self.reason, self.samples = url, start, stop, reason, samples
        where = [f"samples {samples[0]} to {samples[1] - 1}"] if samples else []
        where += [f"bytes {start} to {stop}"] if start is not None else []
        super().__init__(": ".join([url, ", ".join(where), reason] if where else [url, reason]))

    def __reduce__(self) -> tuple:
        return RemoteError, (self.url, self.start, self.stop, self.reason, self.samples)


class Transient(Exception):
    """A failed attempt worth repeating (a 5xx, a timeout, a short or mislabelled response);
    ``hint`` is added to the error if every attempt fails."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.hint = hint


class Refused(Exception):
    """A failure that another attempt cannot heal: missing or refused credentials, an invalid
    request, a server that claims more bytes than the format allows."""


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path.

    >>> is_url("https://example.org/a.msgpack"), is_url(b"x"), is_url("C:/data")
    (True, False, False)
    """
    return isinstance(path, str) and bool(_URL.match(path))


def split_query(url: str) -> tuple[str, str]:
    """``url`` without its query and fragment, and them (``?...#...``, or ``""``). Only an
    http(s) URL has a query: in the others (``s3://`` ...) a ``?`` or ``#`` is part of an
    object's name.

    >>> split_query("https://example.org/x.msgpack?token=abc#top")
    ('https://example.org/x.msgpack', '?token=abc#top')
    >>> split_query("s3://bucket/what?.msgpack")
    ('s3://bucket/what?.msgpack', '')
    """
    if _family(url) != "http":
        return url, ""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    return url[:cut], url[cut:]


def sibling_url(url: str, suffix: str) -> str:
    """The URL of the file beside the data file at ``url`` whose name adds ``suffix``: the
    suffix goes at the end of the path, before any query (a presigned URL's signature, a
    token), which stays as it is.

    >>> sibling_url("https://example.org/x.msgpack?token=abc&v=2", ".offsets")
    'https://example.org/x.msgpack.offsets?token=abc&v=2'
    >>> sibling_url("s3://bucket/x.msgpack", ".md5")
    's3://bucket/x.msgpack.md5'
    """
    path, query = split_query(url)
    return path + suffix + query


def beside_url(url: str, name: str) -> str:
    """The URL of file ``name`` (a relative path) in the folder of the file at ``url``, with
    the query of ``url`` (a token that opens the folder).

    >>> beside_url("https://example.org/data/train.shards?token=abc", "train-00000.msgpack")
    'https://example.org/data/train-00000.msgpack?token=abc'
    """
    path, query = split_query(url)
    return f"{path.rpartition('/')[0]}/{name}{query}"


def default_cache_dir() -> Path:
    """``$FPIPE_CACHE_DIR``, else ``fpipe/blocks`` in ``$XDG_CACHE_HOME`` (``~/.cache``).

    >>> default_cache_dir().name
    'blocks'
    """
    if os.environ.get("FPIPE_CACHE_DIR"):
        return Path(os.environ["FPIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fpipe" / "blocks"


def size_bound(suffix: str, data_size: int, samples: int | None = None) -> int:
    """The most bytes that file ``suffix`` of a dataset can have, by the format, when its data
    file has ``data_size`` bytes and (once ``.offsets`` is known) ``samples`` samples.

    Every sample takes at least a byte; a key takes at most its sample's bytes plus 256
    (``RawWriter`` keys need not be in their samples); the ``.md5`` file names a handful of
    files, and ``.classes.json`` gets 64 MiB.

    >>> size_bound(".offsets", 1000), size_bound(".offsets", 1000, samples=10)
    (8008, 88)
    >>> size_bound(".key_hashes", 1000, samples=10), size_bound("", 1000)
    (88, 1000)
    """
    n = data_size if samples is None else samples
    if suffix in (".offsets", ".key_hashes"):
        return 8 * (n + 1)
    if suffix == ".keys":
        return 5 + data_size + n * (5 + 256)
    if suffix == ".filter":  # simplebloom's size for max(2, n) elements at fpp 1 / elements
        elements = max(2, n)
        return 32 + 8 + math.ceil(elements * math.log(elements) / math.log(2) ** 2 / 8)
    if suffix == ".key_index":  # a header, a directory of at most n / 64 + 2 entries, 24n,
        # and a checksum of each slot and of each 64 key places
        return 64 + 12 * (n // 64 + 2) + 24 * n + 8 + 4 * (n // 64 + 1)
    if suffix == ".md5":
        return 1 << 16
    if suffix == ".classes.json":
        return 64 << 20
    return data_size


def _family(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    return _SCHEME_FAMILIES.get(scheme, scheme)


def _credentials_hint(url: str) -> str:
    if query_secrets(url):
        return ("the credentials in the URL's query (a presigned URL) were refused: it may have "
                "expired, or be signed for another object; sign it again")
    return _CREDENTIALS_HINTS.get(_family(url), "pass the credentials that fsspec's filesystem "
                                  f"for {_family(url)}:// takes in storage_options")


def _without_userinfo(url: str) -> tuple[str, dict]:
    """``url`` without its user information, and the HTTP basic authentication header that
    the user information stands for (none without)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, {}
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    token = base64.b64encode(pair).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


def check_url_credentials(url: str) -> None:
    """Nothing, unless ``url`` carries credentials (``user:password@``) that its scheme cannot
    use: then a ValueError that says where they go instead (the URL shown without them).

    >>> check_url_credentials("s3://AKIA:secret@bucket/x.msgpack")
    Traceback (most recent call last):
    ...
    ValueError: s3:// URLs cannot carry credentials; got 's3://***@bucket/x.msgpack': set AWS_ACCESS_KEY_ID...
    """
    scheme = url.split("://", 1)[0].lower()
    if scheme in _USERINFO_SCHEMES or _family(url) == "http" or not _without_userinfo(url)[1]:
        return
    raise ValueError(f"{scheme}:// URLs cannot carry credentials; got {redacted_url(url)!r}: "
                     f"{_credentials_hint(url)}")


# --- fetching bytes --------------------------------------------------------------------------

class _SameHostAuthorization(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but sends the ``Authorization`` header only to the host it was
    meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(
                req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_SameHostAuthorization)


class _HttpFetcher:
    """Ranged GETs with the standard library; ``Content-Range`` must match the request. The
    URL's user information becomes HTTP basic authentication."""

    def __init__(self, url: str, options: dict, timeout: float, secrets: Secrets) -> None:
        unknown = set(options) - {"headers"}
        if unknown:
            raise ValueError(f"http(s) URLs take storage_options {{'headers': ...}} only; got "
                             f"storage_options keys {sorted(unknown)}")
        headers = options.get("headers") or {}
        if not isinstance(headers, dict):
            raise TypeError(f"storage_options['headers'] must be a dict; got "
                            f"{redacted_options(headers)}")
        self.url, authorization = _without_userinfo(url)
        self.headers, self.timeout, self.secrets = {**authorization, **headers}, timeout, secrets
        self.shown = redacted_url(url)

    def stat(self) -> tuple[int, str]:
        response = self._open({}, method="HEAD")
        with response:
            size = _content_length(response)
            tag = response.headers.get("ETag") or response.headers.get("Last-Modified") or ""
        if size is None:
            raise Transient("no Content-Length in the HEAD response")
        return size, tag

    def read(self, start: int, stop: int) -> bytes:
        response = self._open({"Range": f"bytes={start}-{stop - 1}"})
        with response:
            if response.status != 206:
                raise Transient(f"HTTP {response.status} instead of 206 Partial Content")
            answered = response.headers.get("Content-Range", "")
            if not answered.startswith(f"bytes {start}-{stop - 1}/"):
                raise Transient(f"Content-Range {answered!r:.100} does not match bytes "
                                 f"{start}-{stop - 1}")
            claimed = _content_length(response)
            if claimed is not None and claimed != stop - start:
                raise Transient(f"Content-Length {claimed} for a range of {stop - start} bytes")
            return _read_all(response, stop - start, self.timeout)

    def copy_to(self, file: IO[bytes], limit: int) -> None:
        response = self._open({})
        with response:
            if response.status != 200:
                raise Transient(f"HTTP {response.status} instead of 200")
            claimed = _content_length(response)
            if claimed is not None and claimed > limit:
                raise Refused(f"the server claims {claimed} bytes; the format allows at most "
                               f"{limit} here")
            _stream(response, file, claimed, limit, self.timeout)

    def _open(self, headers: dict, method: str = "GET") -> Any:
        request = urllib.request.Request(self.url, headers={**self.headers, **headers}, method=method)
        try:
            return _OPENER.open(request, timeout=self.timeout)  # http(s) only
        except urllib.error.HTTPError as error:
            error.close()
            raise self._answer(error.code, str(error.reason)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise Transient(self.secrets.scrub(f"{type(error).__name__}: {error}")) from None

    def _answer(self, code: int, reason: str) -> Exception:
        reason = self.secrets.scrub(f"HTTP {code} {reason:.100}")
        if code == 404:
            return FileNotFoundError(2, "no such object", self.shown)
        if code in _TRANSIENT_HTTP:
            return Transient(reason)
        if code in (401, 403):
            return Refused(f"{reason}: {_credentials_hint(self.url)}")
        return Refused(reason)


def _content_length(response: Any) -> int | None:
    claimed = response.headers.get("Content-Length")
    if claimed is None:
        return None
    if not claimed.strip().isdigit():
        raise Transient(f"Content-Length {claimed!r:.40} is not a number of bytes")
    return int(claimed)


def _read_all(response: Any, size: int, timeout: float) -> bytes:
    """Exactly ``size`` bytes of ``response``: a short body or one that trickles past the
    timeout is a failed attempt (a socket timeout alone resets on every byte)."""
    deadline, parts, done = time.monotonic() + timeout, [], 0
    try:
        while done < size:
            part = response.read(min(size - done, 1 << 20))
            if not part:
                raise Transient(f"short read: {done} of {size} bytes")
            parts.append(part)
            done += len(part)
            if time.monotonic() > deadline:
                raise Transient(f"stalled: {done} of {size} bytes in {timeout} s")
    except (OSError, http.client.HTTPException) as error:  # IncompleteRead is not an OSError
        raise Transient(f"{type(error).__name__}: {error!r:.200}") from None
    return b"".join(parts)


def _stream(response: Any, file: IO[bytes], claimed: int | None, limit: int,
            timeout: float) -> None:
    """The body of ``response`` into ``file``, a MiB at a time, each within ``timeout``: all
    ``claimed`` bytes, or without a claim, at most ``limit`` (more is refused)."""
    wanted, done = limit + 1 if claimed is None else claimed, 0
    try:
        while done < wanted:
            deadline = time.monotonic() + timeout
            part = response.read(min(wanted - done, 1 << 20))
            if not part:
                break
            file.write(part)
            done += len(part)
            if time.monotonic() > deadline:
                raise Transient(f"stalled: {done} bytes, the last MiB took over {timeout} s")
    except (OSError, http.client.HTTPException) as error:
        raise Transient(f"{type(error).__name__}: {error!r:.200}") from None
    if claimed is None and done > limit:
        raise Refused(f"the server sent more than {limit} bytes, the most the format allows here")
    if claimed is not None and done < claimed:
        raise Transient(f"short read: {done} of {claimed} bytes")


class _FsspecFetcher:
    """Ranged reads through an fsspec filesystem (s3fs, gcsfs, ...), each with a timeout."""

    def __init__(self, url: str, options: dict, timeout: float, secrets: Secrets) -> None:
        self.fs, self.path = filesystem(url, options)
        self.url, self.timeout, self.secrets = url, timeout, secrets

    def stat(self) -> tuple[int, str]:
        info = self._call("info", self.path)
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("mtime") or ""
        return int(info["size"]), str(tag)

    def read(self, start: int, stop: int) -> bytes:
        return self._call("cat_file", self.path, start=start, end=stop)

    def copy_to(self, file: IO[bytes], limit: int) -> None:
        size = self.stat()[0]
        if size > limit:
            raise Refused(f"the server claims {size} bytes; the format allows at most {limit} here")
        for start in range(0, size, _STEP):
            stop = min(size, start + _STEP)
            data = self.read(start, stop)
            if len(data) != stop - start:
                raise Transient(f"got {len(data)} bytes instead of {stop - start}")
            file.write(data)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        import fsspec.asyn

        try:
            if getattr(self.fs, "async_impl", False):
                method = getattr(self.fs, "_" + name)
                return fsspec.asyn.sync(self.fs.loop, method, *args, timeout=self.timeout, **kwargs)
            return getattr(self.fs, name)(*args, **kwargs)
        except (FileNotFoundError, IsADirectoryError):
            raise
        except Exception as error:  # botocore, aiohttp and timeouts differ by backend
            raise failure(error, self.url, self.secrets) from None


def failure(error: BaseException, url: str, secrets: Secrets) -> Exception:
    """What a storage library's ``error`` means for ``url``: a failed attempt worth repeating
    (Transient), or one that another cannot heal (Refused), with its text scrubbed of
    ``secrets`` and a hint of what to set where one helps."""
    names = {kind.__name__ for kind in type(error).__mro__}
    text = secrets.scrub(f"{type(error).__name__}: {error}")[:500]
    status = _http_status(error)
    if names & _NO_CREDENTIALS:
        return Refused(f"no credentials ({text}): {_credentials_hint(url)}")
    if isinstance(error, PermissionError) or status in (401, 403):
        return Refused(f"access denied ({text}): check the credentials; {_credentials_hint(url)}")
    if names & _INVALID or isinstance(error, (ValueError, TypeError)):
        return Refused(text)
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return Refused(text)
    if names & _UNREACHABLE and _family(url) == "s3":
        return Transient(text, " (is the endpoint right? AWS_ENDPOINT_URL, or storage_options="
                                "{'client_kwargs': {'endpoint_url': ...}})")
    return Transient(text)


def _http_status(error: BaseException | None) -> int | None:
    """The HTTP status that ``error`` (or an exception it was raised from) reports, if any."""
    for _ in range(4):
        if error is None:
            return None
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        for name in ("status", "code"):
            value = getattr(error, name, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
        error = error.__cause__ or error.__context__
    return None


def _fetcher(url: str, options: dict, timeout: float, secrets: Secrets) -> Any:
    if _family(url) == "http":
        return _HttpFetcher(url, options, timeout, secrets)
    return _FsspecFetcher(url, options, timeout, secrets)


def backoff(tried: int) -> float:
    """Seconds to wait after failed attempt ``tried`` (from 0) of a request that may heal:
    doubling from 50 ms up to 5 s, with jitter, so that many clients do not retry in step.

    >>> 0.025 <= backoff(0) <= 0.075 and 2.5 <= backoff(20) <= 7.5
    True
    """
    return min(_BACKOFF_CAP, _BACKOFF * 2 ** tried) * (0.5 + random.random())


class Retrying:
    """A fetcher behind retries with exponential backoff and jitter, and a length check.
    ``url`` has the credentials the requests need; ``shown`` is what messages show."""

    def __init__(self, url: str, options: dict, timeout: float, retries: int) -> None:
        self.url, self.options, self.timeout, self.retries = url, options, timeout, retries
        self.shown, self.secrets = redacted_url(url), Secrets(url, options)
        self._fetcher: Any = None
        self._pid = -1

    def __repr__(self) -> str:
        return f"Retrying({self.shown!r}, storage_options={redacted_options(self.options)})"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fetcher": None, "_pid": -1}

    def _target(self) -> Any:
        # a forked worker makes its own: fsspec's event loop thread stays in the parent
        if self._pid != os.getpid():
            self._fetcher = _fetcher(self.url, self.options, self.timeout, self.secrets)
            self._pid = os.getpid()
        return self._fetcher

    def stat(self) -> tuple[int, str]:
        return self._attempts(lambda: self._target().stat(), None, None, None)

    def fetch_to(self, path: Path, limit: int) -> None:
        """The whole object into file ``path`` (replaced once whole), streamed; a RemoteError
        if the server claims or sends more than ``limit`` bytes."""
        with replacing(path) as file:
            def attempt() -> None:
                file.seek(0)
                file.truncate()
                self._target().copy_to(file, limit)
            self._attempts(attempt, None, None, None)

    def read(self, start: int, stop: int, samples: tuple[int, int] | None = None) -> bytes:
        def attempt() -> bytes:
            data = self._target().read(start, stop)
            if len(data) != stop - start:
                raise Transient(f"got {len(data)} bytes instead of {stop - start}")
            return data
        return self._attempts(attempt, start, stop, samples)

    def _attempts(self, attempt: Callable[[], Any], start: int | None, stop: int | None,
                  samples: tuple[int, int] | None) -> Any:
        for tried in range(self.retries + 1):
            try:
                return attempt()
            except Refused as error:
                raise RemoteError(self.shown, start, stop, str(error), samples) from None
            except Transient as error:
                if tried == self.retries:
                    raise RemoteError(self.shown, start, stop, f"gave up after {tried + 1} "
                                      f"attempts; last: {error}{error.hint}", samples) from error
                if not tried:
                    _LOG.warning("%s: %s; retrying, at most %d more times (each within %g s)",
                                 self.shown, error, self.retries, self.timeout)
                time.sleep(backoff(tried))
        raise AssertionError("unreachable")


# --- a dataset at a URL ----------------------------------------------------------------------

class RemoteDataset:
    """The index files of the dataset at ``url``, fetched once into the cache and checked, and
    the settings to fetch its samples; :meth:`handle` gives the reader its bytes.

    ``url`` is the URL as messages and reprs show it (without user information); ``path`` is
    the local stand-in for the data file: the index files sit beside it under their usual names
    (the data file itself is never there). Pickles by its settings.
    """

    def __init__(self, url: str, remote: RemoteOptions | None = None) -> None:
        remote = remote or RemoteOptions()
        self.url = redacted_url(url)
        options = check_options(remote.storage_options)
        self.block_size, limit, self.read_ahead, retries, timeout = remote.settings
        cache_dir = remote.cache_dir
        name = basename(url)
        self.source = Retrying(url, options, timeout, retries)
        self.size, tag = self.source.stat()
        root = Path(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir()
        self.budget = Budget(root, limit)
        # the same cache for any credentials (a user's password, a presigned URL's signature,
        # which changes at each signing): they open the door, they do not change the data
        located = f"{redacted_url(_without_userinfo(url)[0])}\0{self.size}\0{tag}"
        self.folder = dataset_folder(self.budget.root, hashlib.sha256(located.encode()).hexdigest()[:32])
        self.path = self.folder / name
        self._fetch_index()

    def __repr__(self) -> str:
        return f"RemoteDataset({self.url!r})"

    def sibling(self, suffix: str) -> Retrying:
        return Retrying(sibling_url(self.source.url, suffix), self.source.options, self.source.timeout,
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
                    sibling = sibling_url(self.url, bad[len(self.path.name):])
                    raise FormatError(f"{bad} does not match the md5 file", path=sibling)
            write_atomically(complete, b"")

    def _fetch_index_files(self) -> list[str]:
        """Fetch the index files: ``.offsets`` first (with ``.md5``), bounded by the data file's
        size; then the others, bounded by the number of samples it gives."""
        fetched = self._fetch_siblings((".md5", ".offsets"), None)
        if ".offsets" not in fetched:  # a legacy .index needs the data file's size to be read
            raise FileNotFoundError(2, "dataset offsets not found (a URL needs the .offsets file; "
                                    "datasets with only a legacy .index are read locally)",
                                    sibling_url(self.url, ".offsets"))
        samples = max(0, self._local(".offsets").stat().st_size // 8 - 1)
        fetched += self._fetch_siblings((".keys", ".key_hashes", ".filter"), samples)
        return [self.path.name + suffix for suffix in fetched]

    def _fetch_siblings(self, suffixes: tuple[str, ...], samples: int | None) -> list[str]:
        """The ``suffixes`` that the server has, fetched into the cache folder; side by side:
        against a far-away server, one round trip for all of them."""
        def fetch(suffix: str) -> bool:
            try:
                self.sibling(suffix).fetch_to(self._local(suffix), size_bound(suffix, self.size, samples))
            except FileNotFoundError:
                return False
            return True

        with concurrent.futures.ThreadPoolExecutor(len(suffixes)) as pool:
            found = list(pool.map(fetch, suffixes))
        return [suffix for suffix, there in zip(suffixes, found) if there]

    def _local(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def handle(self, offsets: bytes) -> RemoteHandle:
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
    """``storage_options`` as a dict (empty for None); a TypeError that shows no value of them
    otherwise."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"storage_options must be a dict; got {redacted_options(options)}")
    return dict(options)


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds; got timeout={timeout!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds; got timeout={timeout!r}")
    return float(timeout)


def basename(url: str) -> str:
    name = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]
    if not name:
        raise ValueError(f"the URL must name a data file; got {redacted_url(url)!r}")
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


def read_whole(url: str, storage_options: dict | None = None, limit: int = 64 << 20) -> bytes:
    """The whole object at ``url`` (a small file, such as a shard index), with the readers'
    retries; a :class:`RemoteError` if the server claims more than ``limit`` bytes."""
    source = Retrying(url, check_options(storage_options), DEFAULT_TIMEOUT, DEFAULT_RETRIES)
    size, _ = source.stat()
    if size > limit:
        raise RemoteError(source.shown, None, None, f"the server claims {size} bytes; at most "
                          f"{limit} are expected")
    return source.read(0, size) if size else b""


def glob_urls(pattern: str, storage_options: dict | None = None) -> list[str]:
    """The data files that a URL pattern with wildcards names, sorted (index files and other
    siblings left out); an http(s) URL, or one without wildcards, names itself.

    >>> glob_urls("https://example.org/train.msgpack")
    ['https://example.org/train.msgpack']
    """
    if _family(pattern) == "http" or not any(c in pattern for c in "*?["):
        return [pattern]
    fs, _ = filesystem(pattern, storage_options)
    sibling = re.compile(r"\.(offsets|keys|key_hashes|key_index|filter|md5|index|shards)$")
    found = [path for path in fs.glob(pattern) if not sibling.search(path)]
    return sorted(fs.unstrip_protocol(path) for path in found)


def filesystem(url: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """The fsspec filesystem that holds ``url``, and the path of ``url`` in it.

    For S3, botocore's own retries are off unless configured (``config_kwargs``, or the
    environment's ``AWS_MAX_ATTEMPTS``): fpipe retries (and reports) itself, and the two would
    multiply into minutes of silence.
    """
    import fsspec.core  # only in this module, and lazily: ``import fpipe`` must not load it

    check_url_credentials(url)
    options = check_options(storage_options)
    if _family(url) == "s3" and not {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        options["config_kwargs"] = config
    return fsspec.core.url_to_fs(url, **options)
