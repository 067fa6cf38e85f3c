"""The block cache behind a dataset at a URL (:mod:`fpipe.remote.urls`): the cache folder and
what in it is the cache's, its byte budget and file locks, and each process's
:class:`RemoteHandle`, which reads cached blocks, fetches the missing ones (once per machine,
under a lock) and reads ahead.

What the cache owns, and touches: in ``cache_dir`` (a folder of the user's, which no one else
may write to), the files ``.usage`` and ``.lock`` and the dataset folders, named by 32 hex
digits and holding the marker file ``.fpipe-cache``; in a dataset folder, the index files, the
lock files ``.lock-0`` to ``.lock-15`` and the folder ``blocks``, which holds block files named
by their number; and, beside any of these, the temporaries of their writers
(``.NAME.PID.THREAD.tmp``). Everything it makes is private to the user (folders 0700, files
0600). Anything else — another name, a link, a folder where a file belongs, an entry that
another user owns — is not the cache's: never read, never counted, never removed.

A block file is written beside its name and renamed into place, and ends with the CRC-32 of its
bytes, checked when a process first opens it. Blocks are read with ``os.pread``, never mapped,
and each read checks that the file still has the size and modification time it had when it was
checked: a block truncated or rewritten on disk is checked again (fetched again if damaged),
never decoded, and never kills the process with ``SIGBUS``.

>>> import tempfile
>>> lock = FileLock(Path(tempfile.mkdtemp()) / ".lock")
>>> with lock:
...     pass
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import itertools
import os
import re
import stat as stats
import struct
import tempfile
import threading
import time
import warnings
import zlib
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from fpipe.errors import FormatError

__all__ = ["Budget", "CachedFile", "FileLock", "RemoteHandle", "dataset_folder", "private_folder",
           "replacing", "write_atomically"]

_ONE = struct.Struct(">Q").unpack_from
_CRC = struct.Struct(">I")
_THREADS = 4
# cache files held open by each process, across its readers (a descriptor each)
_OPEN_BLOCKS = 128
_CHECK_READ = 1 << 20

_MARKER, _MARKER_TEXT = ".fpipe-cache", b"fpipe block cache folder, layout 2\n"
_FOLDER = re.compile(r"[0-9a-f]{32}\Z")
_BLOCK = re.compile(r"(?:0|[1-9][0-9]{0,18})\Z")
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]{1,10})\.[0-9]{1,20}\.tmp\Z")
# the names whose temporaries a sweep removes: in cache_dir, the budget's and the dataset
# folders' (made whole under a temporary name); in a dataset folder (the cache's own), any
_ROOT_TEMPORARY = re.compile(r"(?:usage|[0-9a-f]{32})\Z")
_ANY = re.compile(r"")
_LOCK_STRIPES = 16
# A temporary lives for one write. One older than this whose writer's pid is gone was left by
# a killed process; one older than the second bound is left over whatever its pid (the pid
# may be another's by now, or the writer's in another pid namespace).
_STALE_AFTER, _ABANDONED_AFTER = 60.0, 3600.0
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# --- what is the cache's ---------------------------------------------------------------------

class _NotOurs(PermissionError):
    """An entry where the cache expects one of its own that it did not make."""


def _not_ours(path: Path, why: str) -> _NotOurs:
    return _NotOurs(errno.EPERM, f"not fpipe's cache ({why}); fpipe leaves it alone: remove it "
                                 "or choose another cache_dir", str(path))


def _owned(stat: os.stat_result, kind: int) -> bool:
    return stat.st_uid == os.geteuid() and stats.S_IFMT(stat.st_mode) == kind


_KINDS = {stats.S_IFDIR: "folder", stats.S_IFREG: "regular file"}


def _why_not_ours(stat: os.stat_result, kind: int) -> str:
    if stat.st_uid != os.geteuid():
        return f"owned by uid {stat.st_uid}, not by this user (uid {os.geteuid()})"
    return "a folder" if stats.S_ISDIR(stat.st_mode) else f"not a {_KINDS[kind]}"


def _open_own(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path``, once it is a regular file of this user's (not a link)."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _not_ours(path, "a symbolic link") from None
        if error.errno in (errno.EISDIR, errno.ENXIO):
            raise _not_ours(path, "not a regular file") from None
        raise
    stat = os.fstat(fd)
    if not _owned(stat, stats.S_IFREG):
        os.close(fd)
        raise _not_ours(path, _why_not_ours(stat, stats.S_IFREG))
    return fd


def _own_folder(path: Path) -> None:
    """Nothing, once ``path`` is a folder of this user's (not a link); _NotOurs otherwise."""
    stat = os.lstat(path)
    if not _owned(stat, stats.S_IFDIR):
        why = "a symbolic link" if stats.S_ISLNK(stat.st_mode) else _why_not_ours(stat, stats.S_IFDIR)
        raise _not_ours(path, why)


def _read_own(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a file of this user's of at most ``limit`` bytes."""
    try:
        fd = _open_own(path)
    except (FileNotFoundError, _NotOurs):
        return None
    with open(fd, "rb") as file:
        data = file.read(limit + 1)
    return data if len(data) <= limit else None


def private_folder(root: Path) -> Path:
    """``root`` as the cache folder: made (0700) if missing; a PermissionError if another user
    owns it or others may write to it (they could plant blocks), as ssh treats its keys.

    >>> import stat, tempfile
    >>> folder = private_folder(Path(tempfile.mkdtemp()) / "cache")
    >>> oct(stat.S_IMODE(folder.stat().st_mode))
    '0o700'
    """
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    stat = root.stat()  # a link is followed: cache_dir may point anywhere the user likes
    if not stats.S_ISDIR(stat.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "cache_dir is not a folder", str(root))
    if stat.st_uid != os.geteuid():
        raise _not_ours(root, _why_not_ours(stat, stats.S_IFDIR))
    if stat.st_mode & 0o022:
        raise PermissionError(errno.EPERM, f"the cache folder is writable by others (mode "
                              f"{stats.S_IMODE(stat.st_mode):04o}), who could plant blocks: make "
                              "it private (chmod 700) or choose another cache_dir", str(root))
    return root


def dataset_folder(root: Path, name: str) -> Path:
    """The dataset folder ``name`` in cache folder ``root``: made (with its marker and its
    ``blocks`` folder) if missing, checked to be the cache's if there; stale temporaries in it
    are removed.

    >>> import tempfile
    >>> root = private_folder(Path(tempfile.mkdtemp()))
    >>> folder = dataset_folder(root, "0" * 32)
    >>> sorted(p.name for p in folder.iterdir())
    ['.fpipe-cache', 'blocks']
    >>> (root / ("1" * 32)).mkdir()
    >>> dataset_folder(root, "1" * 32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fpipe.remote.cache._NotOurs: [Errno 1] not fpipe's cache (no marker file .fpipe-cache)...
    """
    if not _FOLDER.match(name):
        raise ValueError(f"a dataset folder is named by 32 hex digits; got {name!r}")
    folder = root / name
    if not _is_dataset_folder(folder):
        with FileLock(root / ".lock"):  # one maker at a time: a half-made folder is a leftover
            _sweep(root, _ROOT_TEMPORARY)
            if not _is_dataset_folder(folder):
                _make_dataset_folder(folder)
    try:
        _own_folder(folder / "blocks")
    except FileNotFoundError:  # the user emptied the cache by hand
        (folder / "blocks").mkdir(mode=0o700, exist_ok=True)
    _sweep_dataset_folder(root, folder)
    return folder


def _is_dataset_folder(folder: Path) -> bool:
    """Whether ``folder`` is a dataset folder of the cache; False if it is missing, and
    _NotOurs if something else is there."""
    try:
        _own_folder(folder)
    except FileNotFoundError:
        return False
    if _read_own(folder / _MARKER, len(_MARKER_TEXT)) != _MARKER_TEXT:
        raise _not_ours(folder, f"no marker file {_MARKER}")
    return True


def _make_dataset_folder(folder: Path) -> None:
    # made whole under a temporary name, then renamed: a dataset folder always has its marker
    staging = _temporary_name(folder)
    staging.mkdir(mode=0o700)
    (staging / "blocks").mkdir(mode=0o700)
    with open(_open_own(staging / _MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as file:
        file.write(_MARKER_TEXT)
    os.rename(staging, folder)


def _temporary_name(path: Path) -> Path:
    """Where the writer of ``path`` (this process and thread) writes before renaming."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[bytes]]:
    """A new private file (0600) that replaces ``path`` when the ``with`` block ends without
    an error, and is removed when it raises.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x"
    >>> with replacing(path) as file:
    ...     _ = file.write(b"whole")
    >>> path.read_bytes(), oct(path.stat().st_mode & 0o777)
    (b'whole', '0o600')
    """
    temporary = _temporary_name(path)
    temporary.unlink(missing_ok=True)  # a killed writer's, whose pid and thread were these
    fd = _open_own(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        with open(fd, "wb+") as file:
            yield file
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with a private file of ``data`` at once (see :func:`replacing`)."""
    with replacing(path) as file:
        file.write(data)


def _sweep_dataset_folder(root: Path, folder: Path) -> None:
    """Remove the stale temporaries of the cache folder ``root`` and of its dataset folder
    ``folder``."""
    _sweep(root, _ROOT_TEMPORARY)
    _sweep(folder, _ANY)
    _sweep(folder / "blocks", _BLOCK)


def _sweep(folder: Path, names: re.Pattern) -> None:
    """Remove the stale temporaries in ``folder`` of the files whose names match ``names``
    (see the module docstring)."""
    now = time.time()
    for name, stat in _listing(folder):
        match = _TEMPORARY.match(name)
        if not (match and names.match(match["name"]) and stat.st_uid == os.geteuid()
                and _stale(match, stat, now)):
            continue
        if stats.S_ISREG(stat.st_mode):
            (folder / name).unlink(missing_ok=True)
        elif stats.S_ISDIR(stat.st_mode) and _FOLDER.match(match["name"]):
            _remove_half_made(folder / name)


def _stale(match: re.Match, stat: os.stat_result, now: float) -> bool:
    age = now - stat.st_mtime
    return age > _ABANDONED_AFTER or (age > _STALE_AFTER and not _running(int(match["pid"])))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_half_made(staging: Path) -> None:
    """A dataset folder that its maker left before renaming it: only what the maker puts there
    goes, and the folder itself only once empty."""
    with contextlib.suppress(FileNotFoundError, _NotOurs):
        os.close(_open_own(staging / _MARKER))
        (staging / _MARKER).unlink()
    with contextlib.suppress(OSError):
        (staging / "blocks").rmdir()
        staging.rmdir()


def _listing(folder: Path) -> list[tuple[str, os.stat_result]]:
    """The names in ``folder`` and their ``lstat`` (those that vanish meanwhile left out)."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return found


def _cached_blocks(root: Path) -> list[tuple[int, int, Path]]:
    """The block files of the cache as ``(last use, size, path)``; stale temporaries in the
    dataset folders are removed on the way."""
    blocks = []
    for name, stat in _listing(root):
        folder = root / name
        if not (_FOLDER.match(name) and _owned(stat, stats.S_IFDIR)):
            continue
        if _read_own(folder / _MARKER, len(_MARKER_TEXT)) != _MARKER_TEXT:
            continue
        _sweep_dataset_folder(root, folder)
        for block, block_stat in _listing(folder / "blocks"):
            if _BLOCK.match(block) and _owned(block_stat, stats.S_IFREG):
                blocks.append((block_stat.st_atime_ns, block_stat.st_size, folder / "blocks" / block))
    return blocks


# --- the shared budget and the locks ---------------------------------------------------------

class FileLock:
    """An exclusive ``flock`` on a lock file, taken through a descriptor of its own: it excludes
    other processes and the other threads of this one alike (``lockf`` locks belong to the
    process, so its threads would share them, and its deadlock check misfires with threads).
    The lock file must be the user's own regular file (it is made 0600 if missing)."""

    def __init__(self, path: Path) -> None:
        self.path, self._fd = path, -1

    def __enter__(self) -> None:
        self._fd = _open_own(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self._fd)
            raise

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._fd)  # closing the descriptor releases the lock


class Budget:
    """The byte budget of a cache folder, shared by every process that uses it.

    ``.usage`` holds the bytes of all block files; it changes under a lock on ``.lock``.
    Admitting a block that would pass the limit first deletes the least recently used blocks
    (by access time, which a reader sets when it opens a block); only block files of the
    cache count, and only they are deleted.
    """

    def __init__(self, root: Path, limit: int) -> None:
        self.root, self.limit = private_folder(root), limit

    def admit(self, size: int) -> None:
        usage_file = self.root / ".usage"
        with FileLock(self.root / ".lock"):
            recorded = _read_own(usage_file, 20)
            usage = int(recorded) if recorded and recorded.isdigit() else self._evict(0)
            if usage + size > self.limit:
                usage = self._evict(size)
            write_atomically(usage_file, str(usage + size).encode())

    def _evict(self, room: int) -> int:
        """Delete the least recently used blocks until ``room`` more bytes fit; the bytes that
        remain."""
        blocks = sorted(_cached_blocks(self.root))
        total = sum(size for _, size, _ in blocks)
        for _, size, path in blocks:
            if total + room <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
        return total


def _block_lock(folder: Path, number: int) -> FileLock:
    """The lock that the fetchers of block ``number`` of dataset folder ``folder`` take: one of
    a fixed number of lock files, so that they do not pile up one per block."""
    return FileLock(folder / f".lock-{number % _LOCK_STRIPES}")


# --- blocks ----------------------------------------------------------------------------------

class _Span:
    """Bytes ``start`` to ``stop`` of the data file, samples ``first`` to ``last - 1``."""

    __slots__ = ("first", "last", "start", "stop")

    def __init__(self, start: int, stop: int, first: int, last: int) -> None:
        self.start, self.stop, self.first, self.last = start, stop, first, last


class _OpenBlock:
    """A cache file open for reading the bytes of ``span``, and the ``identity`` (size and
    modification time) it had when its CRC was checked. The descriptor closes when the last
    reference goes, so a read in another thread never finds it closed."""

    __slots__ = ("fd", "identity", "start", "stop")

    def __init__(self, span: _Span, fd: int) -> None:
        self.start, self.stop, self.fd = span.start, span.stop, fd
        self.identity = _identity(os.fstat(fd))

    def __del__(self, _close=os.close) -> None:
        # os.close is bound early: at interpreter exit the os module may already be gone
        _close(self.fd)

    def read(self, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` of the data file; None if the cache file is not as it was
        when it was checked (truncated, or written to since)."""
        data = _pread(self.fd, stop - start, start - self.start)
        if len(data) != stop - start or _identity(os.fstat(self.fd)) != self.identity:
            return None
        return data


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    """What tells a file from itself rewritten, as the local reader tells it: size and
    modification time (a reader marks its use of a block in the access time only); and the
    inode, which tells a file from another put in its place."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts, done = [data], len(data)  # one read returns at most about 2 GiB on Linux
    while done < size and (part := os.pread(fd, size - done, offset + done)):
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _intact(fd: int, size: int) -> bool:
    """Whether the cache file of ``size`` bytes ends with the CRC-32 of the bytes before."""
    crc, body = 0, size - _CRC.size
    for offset in range(0, body, _CHECK_READ):
        crc = zlib.crc32(_pread(fd, min(_CHECK_READ, body - offset), offset), crc)
    tail = _pread(fd, _CRC.size, body)
    return len(tail) == _CRC.size and crc == _CRC.unpack(tail)[0]


class _OpenBlocks:
    """The cache files this process holds open, across all its readers: at most ``limit``; the
    longest held goes first (its descriptor closes once no read uses it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reset()

    def reset(self) -> None:
        # also in a forked child: the parent's threads may have held the lock at the fork
        self.lock, self.blocks = threading.Lock(), {}

    def put(self, key: tuple[int, int], block: _OpenBlock) -> None:
        with self.lock:
            self.blocks.pop(key, None)
            self.blocks[key] = block
            while len(self.blocks) > self.limit:
                del self.blocks[next(iter(self.blocks))]

    def drop(self, key: tuple[int, int]) -> None:
        with self.lock:
            self.blocks.pop(key, None)


_OPEN = _OpenBlocks(_OPEN_BLOCKS)
os.register_at_fork(after_in_child=_OPEN.reset)
_HANDLES = itertools.count()


class _Starts:
    """The start offsets of the samples as a sequence, for :func:`bisect.bisect_left`."""

    def __init__(self, offsets: bytes, n: int) -> None:
        self.offsets, self.n = offsets, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return _ONE(self.offsets, 8 * index)[0]


class CachedFile(Protocol):
    """What a :class:`RemoteHandle` needs of the file at a URL whose blocks it reads: a
    ``RemoteDataset`` (:mod:`fpipe.remote.urls`), or any file a foreign reader opens there."""

    url: str  # as messages show it
    size: int  # of the file, in bytes
    block_size: int
    read_ahead: int  # blocks fetched ahead of the reader at most
    folder: Path  # the file's folder in the cache
    budget: Budget
    source: Any  # the fetcher: read(start, stop, samples=None) -> bytes, retried


class RemoteHandle:
    """One process's view of the samples of a :class:`CachedFile`, with the interface of
    the reader's local file handle (``fd`` None, ``offsets``, ``size``, ``read``,
    ``offsets_between``, ``offset_range``, ``changed``) and read-ahead (:meth:`prefetch`).
    Cached blocks are checked (length and CRC-32) when first opened and at every read (size
    and modification time, see the module docstring)."""

    fd = None

    def __init__(self, dataset: CachedFile, offsets: bytes) -> None:
        self.dataset, self.offsets, self.size = dataset, offsets, dataset.size
        self.block_size, self.n = dataset.block_size, len(offsets) // 8 - 1
        self.blocks_folder = dataset.folder / "blocks"
        self._token = next(_HANDLES)
        # the identity of each block file whose CRC this process checked: reopened as it was,
        # it need not be read whole again
        self.verified: dict[int, tuple[int, int, int]] = {}
        self._spans: dict[int, _Span | None] = {}
        self._reset_threads()

    def _reset_threads(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._inflight: dict[int, concurrent.futures.Future] = {}
        self.ready: set[int] = set()  # blocks fetched ahead that the reader has not asked for
        self._ahead = _ReadAhead(self)

    def _own(self) -> None:
        # locks taken by threads of the parent are never released in a forked child
        if self._pid != os.getpid():
            self._reset_threads()

    def read(self, start: int, stop: int) -> bytes:
        # the common case first, in as few steps as can be (_OpenBlock.read inlined): it runs
        # once a sample
        block = _OPEN.blocks.get((self._token, start // self.block_size))
        if block is not None and block.start <= start and stop <= block.stop:
            data = os.pread(block.fd, stop - start, start - block.start)
            if len(data) == stop - start and _identity(os.fstat(block.fd)) == block.identity:
                return data
        return self.gather(start, min(stop, self.size))

    def resident_offsets(self, path: Path) -> bytes:
        return self.offsets

    def offsets_between(self, start: int, stop: int, path: Path) -> tuple[int, ...]:
        return struct.unpack(f">{stop - start + 1}Q", self.offsets[8 * start:8 * (stop + 1)])

    def check_unchanged(self, path: Path, index: int, offset: int) -> None:
        """Nothing to check: every read checked its block (see the class docstring)."""

    def changed(self, error: FormatError) -> None:
        """None: a read never returns bytes of a changed block (see the class docstring)."""
        return None

    def offset_range(self, start: int, stop: int, path: Path) -> tuple[tuple[int, ...], int]:
        count = stop - start + 1
        data = self.offsets[8 * start:8 * (stop + 1)]
        values = np.frombuffer(data, dtype=">u8")
        drops = np.flatnonzero(values[1:] < values[:-1])
        return struct.unpack(f">{count}Q", data), int(drops[0]) + 1 if drops.size else count

    def span(self, number: int) -> _Span | None:
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
                block = _Span(start, min(stop, self.size), first, last)
            self._spans[number] = block
        return block

    def gather(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` across blocks; bytes no block holds (only where the index is
        damaged) are fetched directly."""
        parts = []
        while start < stop:
            number = start // self.block_size
            block = self.load(number)
            if block is None or not block.start <= start < block.stop:
                parts.append(self.dataset.source.read(start, stop))
                break
            end = min(stop, block.stop)
            parts.append(self._read_checked(number, block, start, end))
            start = end
        return b"".join(parts)

    def _read_checked(self, number: int, block: _OpenBlock, start: int, stop: int) -> bytes:
        data = block.read(start, stop)
        if data is None:  # changed on disk since its check: checked again, fetched if damaged
            self._forget(number)
            block = self.load(number)
            data = block.read(start, stop) if block is not None else None
        if data is None:
            raise FormatError(f"cached block {number} (bytes {start} to {stop}) changed on disk "
                              f"again as it was read; is another program writing to "
                              f"{self.blocks_folder}?", path=self.dataset.url, offset=start)
        return data

    def _forget(self, number: int) -> None:
        _OPEN.drop((self._token, number))
        self.verified.pop(number, None)

    def holds(self, number: int) -> bool:
        """Whether block ``number`` is at hand: open, or fetched ahead."""
        return (self._token, number) in _OPEN.blocks or number in self.ready

    def load(self, number: int, ahead: bool = False) -> _OpenBlock | None:
        """Block ``number``, open: from this process, the cache, or the network. Blocks loaded
        ``ahead`` wait on disk (in ``ready``) until the reader asks for them, which tells the
        read-ahead how far the reader has come."""
        self._own()
        if not ahead:
            self._ahead.consumed(number)
        with self._mutex:
            if ahead and self.holds(number):
                return None
            block = None if ahead else _OPEN.blocks.get((self._token, number))
            if block is not None:
                return block
            future = self._inflight.get(number)
            owner = future is None
            if owner:
                future = self._inflight[number] = concurrent.futures.Future()
        if not owner:
            return future.result()
        try:
            block = self._obtain(number, ahead)
        except BaseException as error:
            with self._mutex:
                self._inflight.pop(number, None)
            future.set_exception(error)
            raise
        with self._mutex:
            self._inflight.pop(number, None)
            self._keep(number, block, ahead)
        future.set_result(block)
        return block

    def _keep(self, number: int, block: _OpenBlock | None, ahead: bool) -> None:
        if block is None:
            return
        if ahead:
            self.ready.add(number)  # its file is on disk: it is reopened when asked for
        else:
            self.ready.discard(number)
            _OPEN.put((self._token, number), block)

    def span_count(self) -> int:
        """One more than the number of the last block."""
        return _ONE(self.offsets, 8 * (self.n - 1))[0] // self.block_size + 1 if self.n else 0

    def _obtain(self, number: int, ahead: bool) -> _OpenBlock | None:
        span = self.span(number)
        if span is None:
            return None
        path = self.blocks_folder / str(number)
        try:
            block = self._open_cached(number, path, span)
            if block is None:
                with _block_lock(self.dataset.folder, number):
                    block = self._open_cached(number, path, span) or self._download(number, path, span)
        except _NotOurs as error:
            if ahead:
                return None
            warnings.warn(f"{error}; block {number} of {self.dataset.url} is read without the "
                          "cache", RuntimeWarning, stacklevel=2)
            block = self._download_aside(span)
        return block

    def _open_cached(self, number: int, path: Path, span: _Span) -> _OpenBlock | None:
        """The cached block at ``path``, open, if it is whole and its CRC matches; a damaged one
        is deleted (then fetched again). _NotOurs if ``path`` is not a block file of the
        cache."""
        try:
            block = _OpenBlock(span, _open_own(path))
        except FileNotFoundError:
            return None
        size = block.identity[0]
        if size != span.stop - span.start + _CRC.size or (
                self.verified.get(number) != block.identity and not _intact(block.fd, size)):
            path.unlink(missing_ok=True)
            return None
        self.verified[number] = block.identity
        # the budget evicts the least recently used blocks first; the modification time stays,
        # since every read compares it
        os.utime(block.fd, ns=(time.time_ns(), block.identity[1]))
        return block

    def _download(self, number: int, path: Path, span: _Span) -> _OpenBlock:
        data = self.dataset.source.read(span.start, span.stop, (span.first, span.last))
        with replacing(path) as file:
            file.write(data)
            file.write(_CRC.pack(zlib.crc32(data)))
            file.flush()
            block = _OpenBlock(span, os.dup(file.fileno()))
            self.dataset.budget.admit(len(data) + _CRC.size)
        self.verified[number] = block.identity
        return block

    def _download_aside(self, span: _Span) -> _OpenBlock:
        """The block in a file of this process's alone (unnamed, gone when closed), for when its
        place in the cache holds something that is not the cache's."""
        data = self.dataset.source.read(span.start, span.stop, (span.first, span.last))
        with tempfile.TemporaryFile(dir=self.blocks_folder) as file:
            file.write(data)
            file.flush()
            return _OpenBlock(span, os.dup(file.fileno()))

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Fetch, in the background, the blocks that samples ``indices`` (in the order they
        will be read) need; a new call replaces the plan of the last."""
        self._own()
        if self.dataset.read_ahead:
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
        return [n for n in unique[np.argsort(first)].tolist()
                if (self._token, n) not in _OPEN.blocks]


class _ReadAhead:
    """Background threads (at most ``_THREADS``) fetching the blocks of a plan, at most
    ``read_ahead`` blocks past the last one the reader asked for. Without a plan, a reader
    that asks for block ``k`` right after ``k - 1`` gets the blocks after ``k`` planned."""

    def __init__(self, handle: RemoteHandle) -> None:
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
            if position is None and sequential and not self.handle.holds(number):
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
