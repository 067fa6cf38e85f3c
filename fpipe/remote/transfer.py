"""Whole datasets to and from URLs: :class:`Upload` (what a writer given a URL writes through)
and :func:`download_dataset` (what ``fpipe cp`` fetches with); :data:`SIBLINGS` lists the files
a dataset may have besides its data file, in upload order.

>>> SIBLINGS[-1]
'.offsets'
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fpipe.errors import Secrets, redacted_url
from fpipe.files import (
    SUFFIX_CLASSES,
    SUFFIX_FILTER,
    SUFFIX_KEY_HASHES,
    SUFFIX_KEY_INDEX,
    SUFFIX_KEYS,
    SUFFIX_MD5,
    SUFFIX_OFFSETS,
)
from fpipe.remote.urls import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    Refused,
    RemoteError,
    Retrying,
    basename,
    check_options,
    failure,
    filesystem,
    sibling_url,
    size_bound,
)

__all__ = ["SIBLINGS", "Upload", "download_dataset"]

# Every file a dataset may have besides its data file, in upload order: ``.offsets`` goes
# last, because a reader needs it to open the dataset, so the dataset appears only when whole.
SIBLINGS = (SUFFIX_KEYS, SUFFIX_KEY_HASHES, SUFFIX_FILTER, SUFFIX_KEY_INDEX, SUFFIX_CLASSES,
            SUFFIX_MD5, SUFFIX_OFFSETS)
_UPLOAD_TRIES, _UPLOAD_BACKOFF = 3, 0.05


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
        self.url = redacted_url(url)  # as messages show it
        if url.split("://", 1)[0].lower() in ("http", "https"):
            raise ValueError("fpipe writes to object storage (s3://, gs://, ...), not to http(s) "
                             f"URLs; got {self.url!r}")
        name = basename(url)
        self._secrets = Secrets(url, storage_options)
        self.fs, self._remote = filesystem(url, storage_options)
        existing = [suffix for suffix in ("", *SIBLINGS)
                    if self._retry(self.fs.exists, self._remote + suffix)]
        if existing and not overwrite:
            raise FileExistsError(17, "dataset exists (pass overwrite=True to replace it)",
                                  sibling_url(self.url, existing[0]))
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
                  desc=basename(self.url)) as bar:
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
        """``call(*args)``, tried again after a failure that may heal; a RemoteError (that
        shows no credential) when it does not."""
        for tried in range(_UPLOAD_TRIES):
            try:
                return call(*args)
            except FileNotFoundError:
                raise
            except Exception as error:  # botocore and aiohttp errors differ by backend
                meaning = failure(error, self.url, self._secrets)
                if isinstance(meaning, Refused):
                    raise RemoteError(self.url, None, None, str(meaning)) from None
                if tried + 1 == _UPLOAD_TRIES:
                    raise RemoteError(self.url, None, None, f"upload failed after {tried + 1} attempts; "
                                      f"last: {meaning}{meaning.hint}") from None
                time.sleep(_UPLOAD_BACKOFF * 4 ** tried)
        raise AssertionError("unreachable")


def download_dataset(url: str, path: Path, storage_options: dict | None = None,
                     progress: bool = False) -> list[Path]:
    """Fetch every file of the dataset at ``url`` to data file ``path`` and its siblings (with
    retries, in ranges of 8 MiB); the files written. ``.offsets`` must be there: without it
    the URL holds no whole dataset.
    """
    from tqdm import tqdm

    options = check_options(storage_options)
    sources = [(suffix, Retrying(sibling_url(url, suffix), options, DEFAULT_TIMEOUT, DEFAULT_RETRIES))
               for suffix in ("", *SIBLINGS)]
    sizes = _sizes(url, sources)
    written = []
    with tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, disable=not progress,
              desc=basename(url)) as bar:
        for suffix, source in sources:
            if suffix in sizes:
                target = path.with_name(path.name + suffix)
                _fetch_file(source, sizes[suffix], target, bar)
                written.append(target)
    return written


def _sizes(url: str, sources: list[tuple[str, Retrying]]) -> dict[str, int]:
    """The sizes of the dataset's files at ``url`` (those that are there), once each is within
    what the format allows for the data file's size and the samples that ``.offsets`` holds."""
    sizes = {}
    for suffix, source in sources:
        try:
            sizes[suffix] = source.stat()[0]
        except FileNotFoundError:
            if suffix in ("", ".offsets"):
                raise FileNotFoundError(2, "no dataset at the URL (need the data file and "
                                        ".offsets)", redacted_url(sibling_url(url, suffix))) from None
    samples = min(sizes[".offsets"], size_bound(".offsets", sizes[""])) // 8 - 1
    for suffix, size in sizes.items():
        bound = size_bound(suffix, sizes[""], None if suffix == ".offsets" else max(samples, 0))
        if size > bound:
            raise RemoteError(sibling_url(url, suffix), None, None, f"the server claims {size} bytes; the "
                              f"format allows at most {bound} here")
    return sizes


def _fetch_file(source: Retrying, size: int, target: Path, bar: Any) -> None:
    step = 8 << 20
    with open(target, "wb") as file:
        for start in range(0, size, step):
            block = source.read(start, min(size, start + step))
            file.write(block)
            bar.update(len(block))
