"""Rebuild the index of a data file from its samples, without losing an intact one.

A data file is msgpack messages back to back, so its index can be rebuilt by reading them in
order: what :func:`rebuild_index` (and ``fpipe index``) does for a dataset whose writer was
killed, or whose index files are lost. Damage in the middle does not end the scan. At a message
that is not a sample, the scan looks for the next place where samples decode again, by
decoding, whatever the samples before looked like: a sample and the next after it (or one up
to the end of the file, or one that damage follows), and goes on from there; the bytes in
between are a :class:`DamagedRegion`. Only a tail that is one incomplete message (a writer
killed while writing it), in which no sample decodes, is cut off without asking, and its bytes
are kept beside the data file. A damaged region between samples is dropped only when
``drop_damaged=True`` says so, and then the original data file is kept beside the new one.
What the bytes cannot tell apart (see :class:`UndecidedDataError`) is refused:

>>> import os, tempfile
>>> from fpipe.dataset import MsgpackReader, pack_sample
>>> path = os.path.join(tempfile.mkdtemp(), "hurt.msgpack")
>>> samples = [pack_sample({"key": key, "n": 1}) for key in "abcd"]
>>> with open(path, "wb") as file:
...     _ = file.write(samples[0] + b"\\xc1\\xc1 a damaged patch" + b"".join(samples[1:]))
>>> rebuild_index(path)
Traceback (most recent call last):
...
fpipe.dataset.recovery.DamagedDataError: ...hurt.msgpack: 1 damaged region (18 bytes) lies ...
>>> report = rebuild_index(path, drop_damaged=True)
>>> report.samples, report.damaged[0].start, report.damaged[0].stop, report.backup.name
(4, 10, 28, 'hurt.msgpack.damaged')
>>> [sample["key"] for sample in MsgpackReader(path)]
['a', 'b', 'c', 'd']
"""

from __future__ import annotations

import bisect
import enum
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

from fpipe.dataset import writer
from fpipe.dataset._indexing import Built, IndexBuilder
from fpipe.dataset._staging import staging_folder
from fpipe.dataset.format import (
    DECODE_ERRORS,
    DatasetFiles,
    PathLike,
    corrupt_reason,
    decode_numpy,
    open_regular,
)
from fpipe.errors import FormatError

__all__ = ["DamagedDataError", "DamagedRegion", "RebuildReport", "UndecidedDataError",
           "rebuild_index"]

_MAX_MESSAGE = 2 ** 32 - 1  # msgpack's own bound on a message's length fields
_PROGRESS_EVERY = 4096  # samples between two calls of rebuild_index's progress
_SEARCH_BLOCK = 1 << 20  # bytes searched at a time for where samples begin again
# A candidate message is decoded from its first 4 KiB (most end within a few bytes), then 4
# times more each time the decoder wants more, up to the end of the file: a sample found
# again may be of any size.
_CANDIDATE_READ = 4096
# A map begins a candidate sample when the str "key" follows it within 1 MiB, or twice the
# largest sample seen (see _DataScan.window).
_CANDIDATE_WINDOW = 1 << 20
_KEY = b"\xa3key"  # the str "key", as msgpack packs it
# How many bytes before a candidate an array header ends, by its size: fixarray, array 16, 32
_ARRAY_HEADERS = ((1, range(0x90, 0xA0)), (3, (0xDC,)), (5, (0xDD,)))
_MAPS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])  # the first bytes of a msgpack map
_MAP_BYTES = np.isin(np.arange(256), sorted(_MAPS))  # ... as a table
_STRS = frozenset([*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB])  # ... and of a str
_BYTES = _STRS | {0xC4, 0xC5, 0xC6}  # ... and of a str or bin
# A message walked by its headers is decoded too if it is this small (or may be a sample);
# one with more items than this is decoded at once (in C), not walked.
_DECODED_WHOLE, _WALKED_ITEMS = 1 << 16, 1 << 16
# A sample swallowed by another is looked for where a map begins at most this many bytes
# before a "key" inside that other sample.
_INNER_REACH = 256
# msgpack's headers, by first byte: arrays and maps (bytes of the count, items per count);
# str, bin and ext (bytes of the length, bytes before the data); the others (bytes after it)
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
          0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}
_FIXED = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4,
          0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_OLD_INDEX_TRIES = 256  # old offsets tried before the old index is taken not to fit
_OLD_BLOCK = 1 << 14  # old offsets read at a time
_HANDED = 1 << 16  # samples held before they are handed to the index builder
_INCOMPLETE = "an incomplete message: it runs past the end of the file"
_OVERRUN = "a sample that runs into the samples after it"
_HOLDS = "a sample that holds whole samples after it in its bytes (a damaged length)"


@dataclass(frozen=True)
class DamagedRegion:
    """Bytes ``[start, stop)`` of a data file where no sample could be read, and why (what the
    first message there was).

    >>> DamagedRegion(10, 28, "corrupt sample").size
    18
    """

    start: int
    stop: int
    reason: str

    @property
    def size(self) -> int:
        """How many bytes the region holds."""
        return self.stop - self.start


@dataclass(frozen=True)
class RebuildReport:
    """What :func:`rebuild_index` found: ``samples`` intact samples, ``valid_bytes`` bytes in
    all; an incomplete last message of ``incomplete_bytes`` bytes; the ``damaged`` regions
    between samples; where the original data file is kept when they are dropped
    (``backup``); and where the incomplete last message is kept when it is cut off the data
    file (``cut_copy``).

    >>> RebuildReport(samples=2, valid_bytes=20, incomplete_bytes=3)
    RebuildReport(samples=2, valid_bytes=20, incomplete_bytes=3, damaged=(), backup=None, cut_copy=None)
    """

    samples: int
    valid_bytes: int
    incomplete_bytes: int
    damaged: tuple[DamagedRegion, ...] = ()
    backup: Path | None = None
    cut_copy: Path | None = None

    def damage(self) -> str:
        """The damaged regions in a sentence: how many, their bytes, the first and why.

        >>> print(RebuildReport(4, 40, 0, (DamagedRegion(10, 28, "bad"),)).damage())
        1 damaged region (18 bytes) lies between intact samples; the first at bytes 10-28: bad
        """
        regions = self.damaged
        if not regions:
            return "no damaged region"
        many = len(regions) > 1
        return (f"{len(regions)} damaged region{'s' if many else ''} "
                f"({sum(region.size for region in regions)} bytes) {'lie' if many else 'lies'} "
                f"between intact samples; the first at bytes {regions[0].start}-"
                f"{regions[0].stop}: {regions[0].reason}")


class DamagedDataError(FormatError):
    """:func:`rebuild_index` changed nothing: damaged bytes lie between intact samples, and
    rebuilding would drop them. ``report`` says what ``drop_damaged=True`` would do.

    >>> region = DamagedRegion(10, 28, "corrupt sample")
    >>> report = RebuildReport(4, 40, 0, (region,), Path("x.msgpack.damaged"))
    >>> print(DamagedDataError(report, "x.msgpack"))  # doctest: +NORMALIZE_WHITESPACE
    x.msgpack: 1 damaged region (18 bytes) lies between intact samples; the first at bytes
    10-28: corrupt sample. Nothing was changed: drop_damaged=True rebuilds the index of the 4
    intact samples, writing them to a new data file and keeping the original as x.msgpack.damaged
    """

    def __init__(self, report: RebuildReport, path: PathLike) -> None:
        self.report = report
        super().__init__(report.damage() + ". Nothing was changed: drop_damaged=True "
                         f"rebuilds the index of the {report.samples} intact samples, writing "
                         "them to a new data file and keeping the original as "
                         f"{report.backup}", path=path)

    def __reduce__(self) -> tuple:
        return DamagedDataError, (self.report, self.path)


class UndecidedDataError(FormatError):
    """:func:`rebuild_index` changed nothing: where samples begin again after damage, the
    sample at byte ``holder`` holds maps that decode as samples, back to back from byte
    ``inner`` up to its end. It has maps with a ``"key"`` nested in it, or it is damaged and
    swallowed intact samples; without the old index, the bytes cannot tell which.

    >>> print(UndecidedDataError(10, 40, "x.msgpack"))  # doctest: +NORMALIZE_WHITESPACE
    x.msgpack: after damage, the sample at byte 10 holds samples from byte 40 up to its end: it
    has maps with a "key" nested in it, or it is damaged and swallowed intact samples. Without
    the old index (.offsets) that cannot be told, so nothing was changed (dropping damaged
    regions would not decide it either)
    """

    def __init__(self, holder: int, inner: int, path: PathLike) -> None:
        self.holder, self.inner = holder, inner
        super().__init__(f"after damage, the sample at byte {holder} holds samples from byte "
                         f"{inner} up to its end: it has maps with a \"key\" nested in it, or "
                         "it is damaged and swallowed intact samples. Without the old index "
                         "(.offsets) that cannot be told, so nothing was changed (dropping "
                         "damaged regions would not decide it either)", path=path)

    def __reduce__(self) -> tuple:
        return UndecidedDataError, (self.holder, self.inner, self.path)


def rebuild_index(path: PathLike, *, truncate: bool = True,
                  progress: Callable[[int], object] | None = None, drop_damaged: bool = False,
                  backup: PathLike | None = None, cut_copy: PathLike | None = None,
                  dry_run: bool = False) -> RebuildReport:
    """Rebuild every index file (and the ``.md5``) of data file ``path`` from its samples.

    Every intact sample, a message that a reader decodes (numpy values included) into a map
    with a str ``"key"``, is indexed; a key found twice raises :class:`FormatError` and nothing
    changes. What follows the last sample, if it is one incomplete message in which no sample
    decodes, is cut off the data file and kept at ``cut_copy`` (default ``path`` +
    ``".incomplete"``, which must not exist); ``truncate=False`` leaves it (readers ignore
    it). Damaged regions between samples,
    or a damaged tail, raise :class:`DamagedDataError` and change nothing, unless
    ``drop_damaged=True``: then the intact samples are written to a new data file, which
    replaces ``path``, and the original is kept at ``backup`` (default ``path`` +
    ``".damaged"``, which must not exist). ``dry_run=True`` only reports what a rebuild
    would do. The new files are written in a staging folder beside ``path`` and renamed into
    place at the end. ``progress``, if given, is called now and then with the number of bytes
    scanned so far (for a progress bar), and once more at the end.

    Memory stays bounded at any number of samples: the scan hands the keys and lengths of the
    samples to the writers' index builder as it goes (about 40 bytes a sample on disk in the
    staging folder meanwhile; a dry run's in the temporary folder), which finds a key repeated
    past the first 1,048,576 that the scan holds; the old index is read a block at a time.

    >>> import os, tempfile
    >>> from fpipe.dataset import pack_sample, MsgpackReader
    >>> path = os.path.join(tempfile.mkdtemp(), "killed.msgpack")
    >>> with open(path, "wb") as file:
    ...     _ = file.write(pack_sample({"key": "a"}) + pack_sample({"key": "b"})[:-2])
    >>> report = rebuild_index(path)
    >>> report.samples, report.valid_bytes, report.incomplete_bytes, report.cut_copy.name
    (1, 7, 5, 'killed.msgpack.incomplete')
    >>> reader = MsgpackReader(path)
    >>> len(reader), reader.get(0)
    (1, {'key': 'a'})
    """
    data = Path(path)
    kept = Path(backup) if backup is not None else data.with_name(data.name + ".damaged")
    tail = Path(cut_copy) if cut_copy is not None else data.with_name(data.name + ".incomplete")
    with _work_folder(data, dry_run) as folder:
        scan = _scan(data, progress or _ignore, folder)
        if scan.undecided:
            raise UndecidedDataError(*scan.undecided[0], data)
        built = scan.finish()
        cuts = truncate and not scan.damaged and scan.tail < scan.size
        report = scan.report(kept if scan.damaged else None, tail if cuts else None)
        if dry_run:
            return report
        if scan.damaged and not drop_damaged:
            raise DamagedDataError(report, data)
        if scan.damaged:
            _rewrite(data, scan, built, kept)
        else:
            _reindex(data, scan, built, tail if cuts else None)
    return report


@contextmanager
def _work_folder(data: Path, dry_run: bool) -> Iterator[Path]:
    """Where the index is built as the scan goes: a staging folder beside the data file, or
    a temporary folder for a dry run, which changes nothing beside it."""
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="fpipe-index-") as folder:
            yield Path(folder)
    else:
        with staging_folder(data) as folder:
            yield folder


def _ignore(_: int) -> None:
    pass


# --- the scan ----------------------------------------------------------------------------


class _DataScan:
    """What a scan found: the samples to index, handed to an index builder as they come (the
    last held back, for the damage found after it may cut it off); where they lie, as runs
    of samples back to back; the damaged regions and where an incomplete tail begins; and
    where the old index, if any, says samples begin. It holds no table of keys or offsets:
    only the first ``WINDOW`` keys (checked at each sample), as a writer does; the builder
    finds a key repeated past them."""

    def __init__(self, path: Path, size: int, builder: IndexBuilder) -> None:
        self.path, self.size, self.builder = path, size, builder
        self.count = 0
        self._window: dict[str, None] = {}
        self._keys: list[str] = []  # not yet handed to the builder
        self._lengths: list[int] = []
        self.runs: list[list[int]] = []  # [start, stop) of samples back to back
        self.last_start = 0
        self.damaged: list[DamagedRegion] = []
        self.tail = size
        self.largest = 0
        self.old = _OldOffsets(path)
        self.undecided: list[tuple[int, int]] = []  # (sample, where samples in it begin)

    @property
    def end(self) -> int:
        """Where the last sample kept so far ends (0 before the first)."""
        return self.runs[-1][1] if self.runs else 0

    def window(self) -> int:
        """How far into a sample found again after damage its "key" may be (and, where the
        old index says a sample begins, how large it may be): twice the largest sample seen
        or in the old index, at least 1 MiB."""
        return max(_CANDIDATE_WINDOW, 2 * self.largest, 2 * self.old.largest)

    def add(self, sample: dict, start: int, stop: int) -> None:
        key = sample["key"]
        if key in self._window:
            raise FormatError(f"duplicate key {key!r}", path=self.path, index=self.count,
                              offset=start)
        if len(self._window) < writer.WINDOW:
            self._window[key] = None
        if len(self._keys) >= _HANDED:
            self.builder.add(self._keys[:-1], self._lengths[:-1])
            del self._keys[:-1], self._lengths[:-1]
        self._keys.append(key)
        self._lengths.append(stop - start)
        if self.runs and self.runs[-1][1] == start:
            self.runs[-1][1] = stop
        else:
            self.runs.append([start, stop])
        self.count += 1
        self.last_start = start
        self.largest = max(self.largest, stop - start)

    def drop_last(self) -> None:
        """Take back the last sample (only that one: the others are with the builder)."""
        self._window.pop(self._keys.pop(), None)
        run = self.runs[-1]
        run[1] -= self._lengths.pop()
        if run[1] == run[0]:
            self.runs.pop()
        self.count -= 1

    def finish(self) -> Built:
        """The index files of the samples kept, built; a key repeated past the window raises
        :class:`FormatError` naming the first sample that repeats one, as the scan does."""
        self.builder.add(self._keys, self._lengths)
        self._keys, self._lengths = [], []
        built = self.builder.finish()
        if built.duplicates:
            first, later, key = min(built.duplicates, key=lambda repeated: repeated[1])
            raise FormatError(f"duplicate key {key!r}", path=self.path, index=later,
                              offset=self._start_of(built, later))
        return built

    def _start_of(self, built: Built, index: int) -> int:
        """Where sample ``index`` of the built index begins in the data file."""
        with open(built.files.offsets, "rb") as file:
            kept = int.from_bytes(os.pread(file.fileno(), 8, 8 * index), "big")
        for start, stop in self.runs:
            if kept < stop - start:
                return start + kept
            kept -= stop - start
        return self.end

    def report(self, backup: Path | None, cut_copy: Path | None) -> RebuildReport:
        return RebuildReport(self.count, sum(stop - start for start, stop in self.runs),
                             self.size - self.tail, tuple(self.damaged), backup, cut_copy)


class _OldOffsets:
    """The offsets of the index being replaced, sorted; none when it is missing or unreadable.
    Damage in the data file leaves them right where it is not: they confirm where intact
    samples begin and end. Read from their file a block at a time, holding only the first of
    each block, when they never decrease (as an index's do); held whole, sorted, when they
    do (a damaged index)."""

    def __init__(self, data: Path) -> None:
        self.count, self.largest = 0, 0
        self._file: BinaryIO | None = None
        self._held: np.ndarray | None = None
        self._firsts = np.zeros(0, np.uint64)  # the first offset of each block
        self._block, self._items = -1, [0]
        self._after = 0  # the first offset past the last sample looked at
        try:
            file = open_regular(DatasetFiles(data).offsets)
            size = os.fstat(file.fileno()).st_size
        except (FormatError, OSError):
            return
        if size % 8 or not size:
            file.close()
            return
        self._file, self.count = file, size // 8
        try:
            if not self._look_over():
                self._hold_sorted()
        except OSError:
            self.close()
            self.count = 0

    def _look_over(self) -> bool:
        """One pass over the offsets: the first of each block, the largest step; whether they
        never decrease."""
        firsts, previous = [], None
        for block in range(0, self.count, _OLD_BLOCK):
            values = self._read(block, block + _OLD_BLOCK)
            if previous is not None:
                values = np.concatenate([[previous], values])
            steps = np.diff(values.astype(np.int64))
            if steps.size and steps.min() < 0:
                return False
            self.largest = max(self.largest, int(steps.max()) if steps.size else 0)
            firsts.append(values[0 if previous is None else 1])
            previous = values[-1]
        self._firsts = np.array(firsts, np.uint64)
        return True

    def _hold_sorted(self) -> None:
        held = np.unique(self._read(0, self.count))
        self.close()
        self._held, self.count = held, len(held)
        self.largest = int(np.diff(held).max()) if len(held) > 1 else 0
        self._firsts = held[::_OLD_BLOCK].copy()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _read(self, low: int, high: int) -> np.ndarray:
        high = min(high, self.count)
        if self._held is not None:
            return self._held[low:high]
        data = os.pread(self._file.fileno(), 8 * (high - low), 8 * low)
        if len(data) != 8 * (high - low):
            raise OSError(errno.EIO, "the offsets file shrank while it was read")
        return np.frombuffer(data, dtype=">u8").astype(np.uint64)

    def _item(self, at: int) -> int:
        block = at // _OLD_BLOCK
        if block != self._block:
            self._block = block
            self._items = self._read(block * _OLD_BLOCK, (block + 1) * _OLD_BLOCK).tolist()
        return self._items[at - block * _OLD_BLOCK]

    def search(self, offset: int, side: str = "left") -> int:
        """Where ``offset`` goes among the offsets (as :func:`numpy.searchsorted`)."""
        block = int(np.searchsorted(self._firsts, offset, side)) - 1
        if block < 0:
            return 0
        self._item(block * _OLD_BLOCK)
        return block * _OLD_BLOCK + int(np.searchsorted(self._items, offset, side))

    def overruns(self, start: int, stop: int) -> bool:
        """Whether the old index has a sample begin at ``start`` and the next before
        ``stop``: the sample that parsed there (a damaged one) swallowed the next. Samples
        are looked at in the order of the file."""
        after, count = self._after, self.count
        while after < count and self._item(after) <= start:
            after += 1
        self._after = after
        return 0 < after < count and self._item(after - 1) == start and self._item(after) < stop

    def spans(self, start: int, stop: int) -> bool:
        """Whether the old index has a sample begin at ``start`` and the next at ``stop``."""
        return self.was_boundary(start) and self.was_boundary(stop) and \
            not self.any_between(start, stop)

    def was_boundary(self, offset: int) -> bool:
        """Whether the old index has a sample begin (or the data end) at ``offset``."""
        at = self.search(offset)
        return at < self.count and self._item(at) == offset

    def any_between(self, start: int, stop: int) -> bool:
        """Whether the old index has a sample begin after ``start`` and before ``stop``."""
        at = self.search(start, "right")
        return at < self.count and self._item(at) < stop

    def following(self, start: int, count: int) -> list[int]:
        """The first ``count`` distinct offsets from ``start`` on."""
        found: list[int] = []
        at = self.search(start)
        while len(found) < count and at < self.count:
            offset = self._item(at)
            if not found or offset != found[-1]:
                found.append(offset)
            at += 1
        return found


@dataclass(frozen=True)
class _Failure:
    """Where the samples of a run stopped: the offset, why (None: the message runs past the
    end of the file), and the first sample of the run."""

    offset: int
    reason: str | None
    first: int


def _scan(data: Path, progress: Callable[[int], object], folder: Path) -> _DataScan:
    with open_regular(data) as file:
        builder = IndexBuilder(folder, data.name)
        try:
            scan = _DataScan(data, os.fstat(file.fileno()).st_size, builder)
            try:
                position = 0
                while position < scan.size:
                    failure = _read_run(file, position, scan, progress)
                    if failure is None:
                        break
                    position = _resynchronise(file, failure, scan)
            finally:
                scan.old.close()
        except BaseException:
            builder.close_files()
            raise
    progress(scan.end)
    return scan


def _read_run(file: BinaryIO, position: int, scan: _DataScan,
              progress: Callable[[int], object]) -> _Failure | None:
    """Index the samples from ``position`` on, up to the end (None) or a failure."""
    file.seek(position)
    # Decoded as a reader decodes (numpy values too), so that every sample indexed can be
    # read; a message never exceeds the rest of the file.
    limit = max(1, min(scan.size - position, _MAX_MESSAGE))
    unpacker = msgpack.Unpacker(file, read_size=min(1 << 20, limit), strict_map_key=False,
                                max_buffer_size=limit, object_hook=decode_numpy)
    first, inside = scan.count, _Inside(file.fileno(), scan.size)
    while (start := position + unpacker.tell()) < scan.size:
        try:
            sample = unpacker.unpack()
        except msgpack.OutOfData:
            return _Failure(start, None, first)
        except DECODE_ERRORS as error:
            return _Failure(start, None if _past_the_end(error) else corrupt_reason(error),
                            first)
        if not _is_sample(sample):
            return _Failure(start, 'a message that is not a map with a str "key"', first)
        end = position + unpacker.tell()
        if scan.old.overruns(start, end):
            return _Failure(start, _OVERRUN, first)
        if not scan.old.spans(start, end) and inside.holds_samples(start, end):
            return _Failure(start, _HOLDS, first)
        scan.add(sample, start, end)
        if scan.count % _PROGRESS_EVERY == _PROGRESS_EVERY - 1:
            progress(scan.end)
    return None


def _past_the_end(error: BaseException) -> bool:
    """Whether a decoding error says that the message declares more bytes or items than the
    rest of the file holds (the decoder's limits are the rest of the file): it is cut."""
    return isinstance(error, msgpack.BufferFull) or (
        isinstance(error, ValueError) and " exceeds max_" in str(error))


def _is_sample(message: Any) -> bool:
    return isinstance(message, dict) and isinstance(message.get("key"), str)


def _resynchronise(file: BinaryIO, failure: _Failure, scan: _DataScan) -> int:
    """Record the damage at ``failure``; return where the samples begin again (or the end).

    The search starts just after the start of the last sample before the failure: if the
    samples begin again inside it, that sample swallowed some of their bytes (a damaged
    length) and is itself damaged. So is one that the old index says ended later. What
    follows the failure is cut off as an incomplete last message only when no sample
    decodes in it (see :func:`_next_start`)."""
    previous = scan.last_start if scan.count > failure.first else None
    floor = failure.offset + 1 if previous is None else previous + 1
    again, doubt = _next_on_old_index(file, floor, scan), None
    if again is None:
        again, doubt = _next_start(file, floor, failure.offset, scan)
    start, reason = failure.offset, failure.reason or _INCOMPLETE
    if previous is not None and again is not None and again < failure.offset:
        start, reason = previous, _OVERRUN
    elif previous is not None and _cut_short(scan, previous, failure.offset):
        start, reason = previous, "a sample that ends before the old index says it does"
    if start != failure.offset:
        scan.drop_last()
    if again is not None:
        scan.damaged.append(DamagedRegion(start, again, reason))
    elif failure.reason is None and start == failure.offset and doubt is None:
        scan.tail = failure.offset
    else:
        scan.damaged.append(DamagedRegion(start, scan.size, _with_doubt(reason, doubt)))
    return scan.size if again is None else again


def _with_doubt(reason: str, doubt: int | None) -> str:
    """Why a damaged region runs to the end of the file, with the sample in it, if any."""
    if doubt is None:
        return reason
    return (f"{reason}; a sample at byte {doubt} decodes, but what follows it runs past the "
            "end of the file: it may be intact, so it is not cut off")


def _cut_short(scan: _DataScan, start: int, stop: int) -> bool:
    """Whether the old index has a sample begin at ``start`` but not end at ``stop``."""
    return scan.old.was_boundary(start) and not scan.old.was_boundary(stop)


def _next_on_old_index(file: BinaryIO, start: int, scan: _DataScan) -> int | None:
    """The first place from ``start`` on where the old index has a sample begin and one
    parses that ends where the old index has the next begin (or at the end of the file).
    None when there is no old index, or it does not describe the bytes after the damage
    (bytes were inserted or removed): then the bytes themselves are searched."""
    fd = file.fileno()
    for offset in scan.old.following(start, _OLD_INDEX_TRIES):
        if offset >= scan.size:
            break
        data = _Bytes(fd, memoryview(b""), offset)
        for message, end in _messages(data, offset, min(scan.size - offset, scan.window())):
            if _is_sample(message) and (end == scan.size or scan.old.was_boundary(end)) and \
                    not scan.old.any_between(offset, end):
                return offset
            break
    return None


class _Verdict(enum.Enum):
    """What decoding from a candidate offset says: intact samples begin there (ACCEPT); a
    sample decodes there but an incomplete message follows it (DOUBT: it may be intact, or a
    map nested in the incomplete last sample); or no intact sample begins there (SKIP)."""

    ACCEPT = "accept"
    DOUBT = "doubt"
    SKIP = "skip"


class _Stop(enum.Enum):
    """Why a run of messages stopped: at the end of the bytes looked at (END), at a message
    that runs past it (CUT), or at bytes that are not a message (BROKEN)."""

    END = "end"
    CUT = "cut"
    BROKEN = "broken"


def _next_start(file: BinaryIO, floor: int, failure: int, scan: _DataScan
                ) -> tuple[int | None, int | None]:
    """The first offset from ``floor`` on where intact samples begin again, found by decoding
    (see :class:`_Search`), or None; and the first offset before it where a sample decodes
    that could not be told from a map nested in an incomplete message (a doubt), or None.

    Candidates are the bytes that begin a msgpack map (a sample is a map) and have the str
    ``"key"`` within ``scan.window()`` after them (a sample has a ``"key"``): the random
    bytes of an image cost a byte test each, not a decoding."""
    fd, window, size = file.fileno(), scan.window(), scan.size
    search = _Search(floor, failure, size)
    for base in range(floor, size, _SEARCH_BLOCK):
        stop = min(base + _SEARCH_BLOCK, size)
        reach = min(max(stop, failure) + window, size)
        data = _Bytes(fd, memoryview(os.pread(fd, reach - base, base)), base)
        for offset in _candidates(data, stop, window):
            if search.accepts(data, offset):
                holding = _holding_sample(data, offset, failure, size)
                if holding is not None:
                    scan.undecided.append(holding)
                return offset, search.doubt
    return None, search.doubt


class _Search:
    """The candidates looked at so far in one search for where samples begin again, from
    ``floor`` on, after the failure at byte ``failure``: the first doubt, and where the list
    nested in a sample that held the last candidate ends (no candidate before it is a
    sample)."""

    def __init__(self, floor: int, failure: int, size: int) -> None:
        self.floor, self.failure, self.size = floor, failure, size
        self.doubt: int | None = None
        self.nested_until = floor
        self._values: set[int] | None = None  # of the sample before the failure

    def accepts(self, data: _Bytes, offset: int) -> bool:
        """Whether intact samples begin at ``offset`` (see :func:`_verdict`), not held by a
        list nested in a sample (see :func:`_holder`)."""
        if offset < self.nested_until or offset == self.failure:  # that failed already
            return False
        verdict = _verdict(data, offset, self.failure, self.size, self._swallowed(data, offset))
        if verdict is _Verdict.SKIP:
            return False
        holder_end = _holder(data, offset, self.floor, self.failure, self.size)
        if holder_end is not None:
            self.nested_until = holder_end
            return False
        if verdict is _Verdict.DOUBT and self.doubt is None:
            self.doubt = offset
        return verdict is _Verdict.ACCEPT

    def _swallowed(self, data: _Bytes, offset: int) -> bool:
        """Whether ``offset`` lies inside the sample before the failure, where none of its
        values begins (see :func:`_value_starts`)."""
        if offset >= self.failure:
            return False
        first = self.floor - 1
        if self._values is None:
            self._values = _value_starts(data.at(first, self.failure - first))
        return offset - first not in self._values


def _candidates(data: _Bytes, stop: int, window: int) -> list[int]:
    """The offsets below ``stop`` of bytes in ``data`` that begin a map with a ``"key"``
    less than ``window`` bytes after them."""
    block = np.frombuffer(data.block[:stop - data.base], np.uint8)
    maps = np.flatnonzero(((block & 0xF0) == 0x80) | (block == 0xDE) | (block == 0xDF))
    maps += data.base
    anchors = data.anchors()
    following = np.searchsorted(anchors, maps)
    near = np.append(anchors, np.iinfo(np.int64).max)[following] < maps + window
    return maps[near].tolist()


class _Bytes:
    """Bytes of the data file: from a block in memory where it has them, else read."""

    def __init__(self, fd: int, block: memoryview, base: int) -> None:
        self.fd, self.block, self.base = fd, block, base

    def at(self, start: int, size: int) -> Any:
        first = start - self.base
        if 0 <= first and first + size <= len(self.block):
            return self.block[first:first + size]
        return os.pread(self.fd, size, start)

    def anchors(self) -> np.ndarray:
        """Where the block holds the str ``"key"`` (file offsets, increasing)."""
        return np.array(_finds(self.block.obj, _KEY), np.int64) + self.base


def _verdict(data: _Bytes, offset: int, past: int, size: int, swallowed: bool) -> _Verdict:
    """Whether intact samples begin at ``offset``: samples back to back from there to beyond
    byte ``past`` (the failure; a candidate before it is inside the sample before the
    failure, where a map nested in it is no sample), and then another sample or the end of
    the file; or, when the candidate is ``swallowed`` (inside the sample before the failure,
    where none of its values begins: the bytes of a str or bin that a damaged length made
    too long), samples back to back from there.

    Damage may follow the last of them too: bytes that do not decode, or a map that is not a
    sample (a damaged one), accept it as well; an incomplete message, one that runs past the
    end of the file, leaves it in doubt. Anything else after it (a str, a number: the next
    field of a sample that holds it) skips it."""
    crossed, samples = False, 0
    for message, end in _messages(data, offset, size - offset):
        if crossed:
            return _after_the_samples(message)
        if not _is_sample(message):
            return _after_the_samples(message) if swallowed and samples else _Verdict.SKIP
        crossed, samples = end > past, samples + 1
    raise AssertionError("_messages ends with a _Stop")  # pragma: no cover


def _after_the_samples(message: Any) -> _Verdict:
    if message is _Stop.CUT:
        return _Verdict.DOUBT
    if message in (_Stop.END, _Stop.BROKEN) or isinstance(message, dict):
        return _Verdict.ACCEPT
    return _Verdict.SKIP


def _holder(data: _Bytes, offset: int, floor: int, failure: int, size: int) -> int | None:
    """The end of a message that holds the samples from ``offset`` on, nested in it, or None.

    A list of maps with a ``"key"`` nested in a sample begins with an array header just
    before its first map, and ends where its last map ends, before the sample's next field.
    So does the message at the failure, when it decodes and holds them (a damaged sample).
    Random bytes before an intact sample rarely do all that: a message in them that holds
    the samples ends inside one of them, or where another begins, or at the end of the file.
    Only headers from ``floor`` on count."""
    starts = [offset - back for back, headers in _ARRAY_HEADERS
              if offset - back >= floor and data.at(offset - back, 1)[0] in headers]
    if floor <= failure < offset:
        starts.append(failure)
    for start in starts:
        message, end = next(_messages(data, start, size - start))
        if isinstance(message, _Stop) or end <= offset or end == size:
            continue
        if _samples_end_at(data, offset, end, size) and \
                not _is_sample(next(_messages(data, end, size - end))[0]):
            return end
    return None


def _samples_end_at(data: _Bytes, offset: int, stop: int, size: int) -> bool:
    """Whether samples lie back to back from ``offset`` to exactly ``stop`` (only the bytes
    before ``stop``, and in the file of ``size`` bytes, are decoded)."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(1, min(stop - offset, _MAX_MESSAGE)),
                                strict_map_key=False, object_hook=decode_numpy)
    unpacker.feed(data.at(offset, min(stop, size) - offset))
    try:
        while unpacker.tell() < stop - offset:
            if not _is_sample(unpacker.unpack()):
                return False
    except (msgpack.OutOfData, *DECODE_ERRORS):
        return False
    return True


def _messages(data: _Bytes, offset: int, window: int) -> Iterator[tuple[Any, int]]:
    """The messages from ``offset`` on, each with the offset where it ends, up to ``window``
    bytes; then why they stopped (a :class:`_Stop`) and where.

    Each message is walked first, reading its headers only (see :func:`_walk`), so that
    random bytes that declare a long str or bin cost nothing. A message that may be a sample
    (a map with a str ``"key"``), or is small, is decoded as a reader decodes it; another,
    large one, stands in as an empty map if it is a map, else as None: what it holds
    matters to no caller."""
    stop, at = offset + window, offset
    while at < stop:
        walked = _walk(data, at, stop)
        if walked is None:  # too many items to walk in Python
            message, end = _unpacked(data, at, stop)
        elif isinstance(walked, _Stop):
            message, end = walked, at
        else:
            end, is_map, has_key = walked
            if has_key or end - at <= _DECODED_WHOLE:
                message = _decoded(data.at(at, end - at))
            else:
                message = {} if is_map else None
        if isinstance(message, _Stop):
            yield message, at
            return
        yield message, end
        at = end
    yield _Stop.END, at


def _walk(data: _Bytes, start: int, stop: int) -> tuple[int, bool, bool] | _Stop | None:
    """Where the message at ``start`` ends, by its headers alone (the bytes of its str and
    bin values are not read), whether it is a map, and whether it has the str ``"key"`` as
    a key with a str value; a :class:`_Stop` if it runs past ``stop`` (or declares more
    items than bytes are left) or has a byte that begins no message; None if it has more
    than ``_WALKED_ITEMS`` items."""
    at, frames, walked, is_map, keyed, has_key = start, [[False, 1]], 0, False, False, False
    while frames:
        frame = frames[-1]
        if not frame[1]:
            frames.pop()
            continue
        walked += 1
        if walked > _WALKED_ITEMS:
            return None
        head = data.at(at, min(9, stop - at))
        if not len(head) or _header_size(head[0]) > len(head):
            return _Stop.CUT
        if head[0] == 0xC1:
            return _Stop.BROKEN
        if len(frames) == 2:  # an item of the message itself
            keyed, has_key = _key_entry(keyed, has_key, frame[0] and frame[1] % 2 == 0, head)
        frame[1] -= 1
        end, items = _skip_header(head, 0)
        at += end
        if at > stop or items > stop - at:
            return _Stop.CUT
        if len(frames) == 1:
            is_map = head[0] in _MAPS
        if items:
            frames.append([head[0] in _MAPS, items])
    return at, is_map, has_key


def _key_entry(keyed: bool, has_key: bool, is_key: bool, head: Any) -> tuple[bool, bool]:
    """After the item of a map that begins with ``head`` (a key if ``is_key``): whether it is
    the str ``"key"``, and whether the map has that key with a str value, given what they
    were before it (``keyed``, ``has_key``)."""
    if is_key:
        return bytes(head[:4]) == _KEY, has_key
    return False, has_key or (keyed and head[0] in _STRS)


def _header_size(first: int) -> int:
    """How many bytes the header of a msgpack value that begins with byte ``first`` takes
    (its first byte, and the count or length after it)."""
    if first in _COUNTED:
        return 1 + _COUNTED[first][0]
    if first in _SIZED:
        return 1 + _SIZED[first][0]
    return 1


def _decoded(message: Any) -> Any:
    """The bytes of one message decoded as a reader decodes them, or _Stop.BROKEN."""
    try:
        return msgpack.unpackb(message, strict_map_key=False, object_hook=decode_numpy)
    except DECODE_ERRORS:
        return _Stop.BROKEN


def _unpacked(data: _Bytes, offset: int, stop: int) -> tuple[Any, int]:
    """The message at ``offset`` decoded, and where it ends; or why it does not decode
    before ``stop`` (a :class:`_Stop`). The bytes go to the decoder 4 KiB at first, then 4
    times more each time it wants more."""
    window = stop - offset
    unpacker = msgpack.Unpacker(max_buffer_size=max(1, min(window, _MAX_MESSAGE)),
                                strict_map_key=False, object_hook=decode_numpy)
    fed, more = 0, _CANDIDATE_READ
    while True:
        try:
            return unpacker.unpack(), offset + unpacker.tell()
        except msgpack.OutOfData:
            if fed == window:
                return _Stop.CUT, offset
            size = min(more, window - fed)
            unpacker.feed(data.at(offset + fed, size))
            fed, more = fed + size, 4 * more
        except DECODE_ERRORS as error:
            return (_Stop.CUT if _past_the_end(error) else _Stop.BROKEN), offset


# --- a sample that holds others ------------------------------------------------------------


class _Inside:
    """Whether a sample holds intact samples in its bytes: a damaged length or count that
    made it swallow the samples after it, exactly up to where one ends, so that it still
    decodes. The str ``"key"`` is looked for a block at a time as the scan goes; only a
    sample with a second ``"key"`` in it (nested maps, or swallowed samples) is looked at
    closer (see :meth:`holds_samples`)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.data = _Bytes(fd, memoryview(b""), 0)
        self.anchors: list[int] = []

    def _within(self, start: int, stop: int) -> list[int]:
        """Where the str "key" lies whole in bytes ``[start, stop)``."""
        data = self.data
        if not data.base <= start or stop > data.base + len(data.block):
            end = min(self.size, max(stop, start + _SEARCH_BLOCK))
            self.data = data = _Bytes(self.fd, memoryview(os.pread(self.fd, end - start,
                                                                   start)), start)
            self.anchors = data.anchors().tolist()
        low = bisect.bisect_left(self.anchors, start)
        return self.anchors[low:bisect.bisect_left(self.anchors, stop - len(_KEY) + 1)]

    def holds_samples(self, start: int, stop: int) -> bool:
        """Whether samples lie back to back from a map inside the sample ``[start, stop)``
        up to exactly its end, beginning where a map nested in it would not (see
        :func:`_value_starts`)."""
        anchors = self._within(start, stop)
        if len(anchors) < 2:
            return False
        values = None
        for inner in _held_samples(self.data, start, stop, self.size, np.array(anchors)):
            if values is None:
                values = _value_starts(self.data.at(start, stop - start))
            if inner - start not in values:
                return True
        return False


def _held_samples(data: _Bytes, start: int, stop: int, size: int,
                  anchors: np.ndarray) -> Iterator[int]:
    """The maps inside the sample ``[start, stop)``, less than ``_INNER_REACH`` bytes before
    one of its ``anchors`` (where it holds the str ``"key"``), from which samples lie back to
    back up to exactly its end."""
    sample = np.frombuffer(data.at(start, stop - start), np.uint8)
    maps = np.flatnonzero(_MAP_BYTES[sample][1:]) + start + 1
    following = np.append(anchors, np.iinfo(np.int64).max)[np.searchsorted(anchors, maps)]
    for inner in maps[following - maps < _INNER_REACH].tolist():
        if _samples_end_at(data, inner, stop, size):
            yield inner


def _holding_sample(data: _Bytes, offset: int, past: int, size: int) -> tuple[int, int] | None:
    """Of the samples that :func:`_verdict` accepted from ``offset`` on, the first that
    holds samples up to its end (see :func:`_held_samples`), and where they begin."""
    start, last = offset, False
    for message, end in _messages(data, offset, size - offset):
        if not _is_sample(message):
            return None
        anchors = np.array(_finds(bytes(data.at(start, end - start)), _KEY), np.int64) + start
        inner = next(_held_samples(data, start, end, size, anchors), None)
        if inner is not None:
            return start, inner
        if last:
            return None
        start, last = end, end > past
    return None


def _finds(block: bytes, part: bytes) -> list[int]:
    """Where ``part`` begins in ``block``."""
    found, at = [], block.find(part)
    while at >= 0:
        found.append(at)
        at = block.find(part, at + 1)
    return found


def _value_starts(message: Any) -> set[int]:
    """Where, in the bytes of one msgpack message, a map nested in a sample may begin: the
    message itself, the items of its arrays, and the values of its maps under a str key; and
    the first byte of such a value's str or bin (a packed sample kept as bytes). A damaged
    length that swallowed samples leaves them further inside the bytes of a str or bin, or
    under a key made of other bytes."""
    starts, at = set(), 0
    frames = [[False, 1, True]]  # per container: a map?, items left, the last key a str?
    while frames:
        frame = frames[-1]
        if not frame[1]:
            frames.pop()
            continue
        is_key = frame[0] and frame[1] % 2 == 0
        frame[1] -= 1
        first = message[at]
        if is_key:
            frame[2] = first in _STRS
        elif frame[2]:
            starts.add(at)
            if first in _BYTES:
                starts.add(at + _header_size(first))
        at, items = _skip_header(message, at)
        if items:
            frames.append([first in _MAPS, items, True])
    return starts


def _skip_header(message: Any, at: int) -> tuple[int, int]:
    """Where the value at ``at`` ends, but for the values nested in it, and how many those
    are."""
    first = message[at]
    if first <= 0x7F or first >= 0xE0 or first in (0xC0, 0xC2, 0xC3):
        return at + 1, 0
    if first <= 0x8F:
        return at + 1, 2 * (first & 0x0F)
    if first <= 0x9F:
        return at + 1, first & 0x0F
    if first <= 0xBF:
        return at + 1 + (first & 0x1F), 0
    if first in _COUNTED:
        width, per_item = _COUNTED[first]
        count = int.from_bytes(message[at + 1:at + 1 + width], "big")
        return at + 1 + width, per_item * count
    if first in _SIZED:
        width, extra = _SIZED[first]
        length = int.from_bytes(message[at + 1:at + 1 + width], "big")
        return at + 1 + width + extra + length, 0
    return at + 1 + _FIXED[first], 0


# --- writing the result ------------------------------------------------------------------


def _reindex(data: Path, scan: _DataScan, built: Built, cut_copy: Path | None) -> None:
    """Index the samples, which lie back to back from byte 0; cut an incomplete tail off,
    keeping its bytes at ``cut_copy`` (with None, leave it)."""
    kept = scan.size if cut_copy is None else scan.end
    digest = _md5_of(data, kept)
    if kept < scan.size:
        _copy_tail(data, kept, scan.size, cut_copy)
        os.truncate(data, kept)
    built.commit(DatasetFiles(data), digest)


def _copy_tail(data: Path, start: int, stop: int, target: Path) -> None:
    """Copy bytes ``[start, stop)`` of ``data`` to a new file ``target``, on disk before the
    data file is cut."""
    try:
        copy = open(target, "xb")
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "the incomplete last sample cut off the data file "
                              "would be kept there, but the name is taken; move it away",
                              str(target)) from None
    with open_regular(data) as source, copy:
        _copy_range(source, copy, start, stop, hashlib.md5())
        copy.flush()
        os.fsync(copy.fileno())


def _rewrite(data: Path, scan: _DataScan, built: Built, backup: Path) -> None:
    """Write the samples to a new data file that replaces ``data``; keep the original."""
    if os.path.lexists(backup):
        raise FileExistsError(errno.EEXIST, "the original of a damaged data file would be kept "
                              "there, but the name is taken; move it away", str(backup))
    staged = built.files.data  # beside the index files, in the staging folder
    digest = _copy_samples(data, staged, scan.runs)
    _keep(data, backup)
    os.replace(staged, data)
    built.commit(DatasetFiles(data), digest)


def _copy_samples(data: Path, target: Path, runs: list[list[int]]) -> str:
    """Copy the byte ranges ``runs`` of ``data`` to ``target``, back to back; their MD5."""
    md5 = hashlib.md5()
    with open_regular(data) as source, open(target, "xb") as copy:
        for start, stop in runs:
            _copy_range(source, copy, start, stop, md5)
    return md5.hexdigest()


def _copy_range(source: BinaryIO, copy: BinaryIO, start: int, stop: int, md5: Any) -> None:
    source.seek(start)
    while start < stop:
        block = source.read(min(1 << 20, stop - start))
        if not block:
            raise FormatError("the data file shrank while it was being rebuilt", path=source.name)
        copy.write(block)
        md5.update(block)
        start += len(block)


def _keep(data: Path, backup: Path) -> None:
    """A second name for the original data file (a copy where hard links are not allowed)."""
    try:
        os.link(data, backup)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        shutil.copy2(data, backup)


def _md5_of(path: Path, length: int) -> str:
    md5 = hashlib.md5()
    with open_regular(path) as file:
        while length and (block := file.read(min(1 << 20, length))):
            md5.update(block)
            length -= len(block)
    return md5.hexdigest()
