"""Official archives: where they are, fetching them (only when asked), checking their md5.

An :class:`Archive` names one official file, its md5 and where it can be downloaded. :func:`fetch`
finds it in a folder, or downloads it there when asked; either way its md5 is checked.
:func:`download` resumes an interrupted transfer with an HTTP ``Range`` request, shows a progress
bar when asked, and verifies TLS certificates with the default SSL context.

>>> import hashlib, os, tempfile
>>> folder = tempfile.mkdtemp()
>>> with open(os.path.join(folder, "hello.txt"), "wb") as file:
...     _ = file.write(b"hello")
>>> archive = Archive("hello.txt", hashlib.md5(b"hello").hexdigest())
>>> fetch(archive, folder).name
'hello.txt'
"""

from __future__ import annotations

import hashlib
import http.client
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fpipe.errors import FpipeError

__all__ = [
    "Archive",
    "ArchiveError",
    "ChecksumError",
    "DownloadError",
    "download",
    "fetch",
    "md5sum",
    "progress_bar",
]

_BLOCK = 1 << 20


class ArchiveError(FpipeError, ValueError):
    """A source archive (or folder) is corrupt, incomplete or not in the official layout.

    Carries ``path`` and names it in the message.

    >>> str(ArchiveError("no member 'test_batch'", path="cifar-10-python.tar.gz"))
    "cifar-10-python.tar.gz: no member 'test_batch'"
    """

    def __init__(self, message: str, *, path: Any = None) -> None:
        self.reason, self.path = message, path
        super().__init__(f"{path}: {message}" if path is not None else message)

    def __reduce__(self):
        return _rebuild_archive_error, (self.reason, self.path)


def _rebuild_archive_error(message: str, path: Any) -> ArchiveError:
    return ArchiveError(message, path=path)


class ChecksumError(ArchiveError):
    """An archive's md5 is not the official one; carries ``path``, ``expected`` and ``actual``.

    >>> error = ChecksumError("x.tar.gz", expected="ab", actual="cd")
    >>> error.expected, error.actual
    ('ab', 'cd')
    """

    def __init__(self, path: Any, *, expected: str, actual: str) -> None:
        self.expected, self.actual = expected, actual
        super().__init__(f"md5 is {actual}, expected {expected}: the file is corrupt or not the "
                         f"official archive; delete it and run again", path=path)

    def __reduce__(self):
        return _rebuild_checksum_error, (self.path, self.expected, self.actual)


def _rebuild_checksum_error(path: Any, expected: str, actual: str) -> ChecksumError:
    return ChecksumError(path, expected=expected, actual=actual)


class DownloadError(FpipeError, OSError):
    """A download failed (network, HTTP status, interrupted transfer); carries ``url``.

    The bytes received so far stay in ``<file>.part``, so running again resumes.

    >>> str(DownloadError("https://example.org/x.gz", "HTTP 404 Not Found"))
    'download of https://example.org/x.gz failed: HTTP 404 Not Found'
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"download of {url} failed: {reason}")

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return type(self), (self.url, self.reason)


@dataclass(frozen=True)
class Archive:
    """One official source file: its name, md5, download URL (None: not downloadable) and the
    splits it holds (empty: needed by every split).

    >>> a = Archive("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c",
    ...             "https://example.org/mnist/t10k-labels-idx1-ubyte.gz", splits=("test",))
    >>> a.url_at("http://127.0.0.1:8000/")
    'http://127.0.0.1:8000/t10k-labels-idx1-ubyte.gz'
    """

    filename: str
    md5: str
    url: str | None = None
    splits: tuple[str, ...] = ()

    def url_at(self, base_url: str | None) -> str | None:
        """The URL to download from: ``url``, or ``filename`` under ``base_url`` when given."""
        if base_url is None:
            return self.url
        return base_url.rstrip("/") + "/" + urllib.parse.quote(self.filename)

    def needed_for(self, splits: tuple[str, ...]) -> bool:
        """Whether writing ``splits`` needs this archive.

        >>> Archive("t10k.gz", "0" * 32, splits=("test",)).needed_for(("train",))
        False
        """
        return not self.splits or any(split in self.splits for split in splits)


def check_base_url(base_url: str | None) -> None:
    """Raise ValueError unless ``base_url`` is None or an http(s) URL."""
    if base_url is not None and urllib.parse.urlsplit(str(base_url)).scheme not in ("http", "https"):
        raise ValueError(f"base_url must be an http:// or https:// URL; got base_url={base_url!r}")


def progress_bar(enabled: bool | None, **options: Any) -> Any:
    """A tqdm bar on stderr, or a no-op stand-in when disabled; ``None`` means "when stderr is
    a terminal". Use as a context manager; ``update(n)`` advances it.

    >>> with progress_bar(False, total=3) as bar:
    ...     bar.update(3)
    """
    if not shows_progress(enabled):
        return nullcontext(_NoBar())
    from tqdm import tqdm
    return tqdm(file=sys.stderr, dynamic_ncols=True, **options)


def shows_progress(progress: bool | None) -> bool:
    """Whether to show progress bars: ``progress``, or for None whether stderr is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


class _NoBar:
    def update(self, n: int = 1) -> None:
        """Nothing to show."""


def md5sum(path: str | os.PathLike, *, progress: bool | None = False) -> str:
    """The md5 hex digest of the file at ``path``.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as file:
    ...     _ = file.write(b"hello"); file.flush()
    ...     md5sum(file.name)
    '5d41402abc4b2a76b9719d911017c592'
    """
    digest = hashlib.md5()
    size = os.path.getsize(path)
    options = dict(total=size, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                   desc=f"md5 {Path(path).name}")
    with open(path, "rb") as file, progress_bar(progress, **options) as bar:
        while block := file.read(_BLOCK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _verify(path: Path, md5: str, progress: bool | None) -> None:
    actual = md5sum(path, progress=progress)
    if actual != md5.lower():
        raise ChecksumError(path, expected=md5.lower(), actual=actual)


def fetch(archive: Archive, folder: str | os.PathLike, *, download: bool = False,
          base_url: str | None = None, verify: bool = True, progress: bool | None = False) -> Path:
    """The path of ``archive`` in ``folder``, downloaded there first if missing and ``download``.

    Its md5 is checked against ``archive.md5`` (``verify=False`` skips the check for a file
    already present; a download is always checked). A missing archive raises
    :class:`FileNotFoundError` saying where to get it, a wrong md5 :class:`ChecksumError`.

    >>> import tempfile
    >>> fetch(Archive("x.tar.gz", "0" * 32, "https://example.org/x.tar.gz"), tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    FileNotFoundError: x.tar.gz not found in ...; download it from https://example.org/x.tar.gz, ...
    """
    path = Path(folder) / archive.filename
    if path.is_file():
        if verify:
            _verify(path, archive.md5, progress)
        return path
    url = archive.url_at(base_url)
    if url is None:
        raise FileNotFoundError(f"{archive.filename} not found in {folder}; it cannot be downloaded "
                                f"automatically: get it from its publisher and put it there")
    if not download:
        raise FileNotFoundError(f"{archive.filename} not found in {folder}; download it from {url}, "
                                f"or ask for the download (--download, download=True)")
    return _download(url, path, archive.md5, progress, timeout=60.0)


def download(url: str, path: str | os.PathLike, *, md5: str | None = None,
             progress: bool | None = False, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``path`` through ``<path>.part``, resuming a partial one, and return
    ``path``.

    A ``.part`` file left by an interrupted run is continued with an HTTP ``Range`` request (a
    server that ignores it gets the whole file again). When ``md5`` is given the finished file
    must match it, or it is deleted and :class:`ChecksumError` raised. Failures raise
    :class:`DownloadError`; TLS certificates are always verified.

    >>> download("ftp://example.org/x", "x")
    Traceback (most recent call last):
    ...
    ValueError: url must be an http:// or https:// URL; got url='ftp://example.org/x'
    """
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"url must be an http:// or https:// URL; got url={url!r}")
    return _download(url, Path(path), md5, progress, timeout)


def _download(url: str, path: Path, md5: str | None, progress: bool | None,
              timeout: float) -> Path:
    part = path.with_name(path.name + ".part")
    path.parent.mkdir(parents=True, exist_ok=True)
    _transfer(url, part, progress, timeout)
    if md5 is not None:
        try:
            _verify(part, md5, progress)
        except ChecksumError as error:
            part.unlink()
            raise ChecksumError(url, expected=error.expected, actual=error.actual) from None
    os.replace(part, path)
    return path


def _ssl_context() -> ssl.SSLContext:
    # The default context verifies certificates and host names; datadings turned both off.
    return ssl.create_default_context()


def _transfer(url: str, part: Path, progress: bool | None, timeout: float) -> None:
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout, context=_ssl_context())
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:
            return  # the part file already holds every byte
        raise DownloadError(url, f"HTTP {error.code} {error.reason}") from None
    except (OSError, http.client.HTTPException) as error:
        raise DownloadError(url, _reason(error)) from None
    with response:
        resumed = bool(have) and response.status == 206
        if resumed and not _starts_at(response, have):
            part.unlink()
            raise DownloadError(url, "the server sent an unexpected byte range; run again to "
                                     "start over")
        with open(part, "ab" if resumed else "wb") as file:
            _copy(response, file, have if resumed else 0, url, progress)


def _starts_at(response: Any, offset: int) -> bool:
    content_range = response.headers.get("Content-Range", "")
    return content_range.startswith(f"bytes {offset}-")


def _copy(response: Any, file: BinaryIO, have: int, url: str, progress: bool | None) -> None:
    length = response.headers.get("Content-Length")
    total = have + int(length) if length and length.isdigit() else None
    options = dict(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=url.rsplit("/", 1)[-1])
    with progress_bar(progress, **options) as bar:
        try:
            while block := response.read(_BLOCK):
                file.write(block)
                bar.update(len(block))
        except (OSError, http.client.HTTPException) as error:
            raise _interrupted(url, file.tell(), total, f" ({_reason(error)})") from None
    if total is not None and file.tell() < total:
        raise _interrupted(url, file.tell(), total, "")


def _interrupted(url: str, done: int, total: int | None, reason: str) -> DownloadError:
    of = f" of {total}" if total is not None else ""
    return DownloadError(url, f"interrupted after {done}{of} bytes{reason}; run again to resume")


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__
