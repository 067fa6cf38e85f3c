"""The block cache behind a dataset at a URL (:mod:`fpipe.storage.remote`): a cache folder's
byte budget and file locks, and each process's :class:`RemoteHandle`, which maps cached blocks,
fetches the missing ones (once per machine, under a lock per block) and reads ahead.

A block file is written beside its name and renamed into place, and ends with the CRC-32 of its
bytes, checked whenever it is opened: a torn or damaged block is fetched again, never decoded.

>>> import tempfile
>>> lock = FileLock(Path(tempfile.mkdtemp()) / ".lock")
>>> with lock:
...     pass
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import mmap
import os
import struct
import threading
import zlib
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .remote import RemoteDataset

__all__ = ["Budget", "FileLock", "RemoteHandle", "write_atomically"]

_ONE = struct.Struct(">Q").unpack_from
_CRC = struct.Struct(">I")
# blocks kept mapped in each process (the pages belong to the page cache, not the process)
_MAPPED_BLOCKS = 256
_THREADS = 4


# --- the shared cache ------------------------------------------------------------------------

class FileLock:
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


class Budget:
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
        with FileLock(self.root / ".lock"):
            try:
                usage = int(usage_file.read_text() or 0)
            except (FileNotFoundError, ValueError):
                usage = self._evict(0)
            if usage + size > self.limit:
                usage = self._evict(size)
            write_atomically(usage_file, str(usage + size).encode())

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


def write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


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

    def __init__(self, handle: RemoteHandle) -> None:
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


class RemoteHandle:
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
            with FileLock(path.with_name(f".{number}.lock")):
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
