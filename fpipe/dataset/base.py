"""The reader API: :class:`Reader`, the base class of every reader.

A subclass provides ``len``, ``in``, ``find_key``, ``find_index`` and ``get``; the rest of
the API (slices, ``get_many``, iterators, datadings's cursor) is built on those. The readers
are :class:`~fpipe.dataset.reader.MsgpackReader` (packed datasets),
:class:`~fpipe.dataset.sharded.ShardedReader` (several as one) and those of
:mod:`fpipe.dataset.unpacked` (lists, directories, zip files).

>>> from fpipe.dataset import ListReader
>>> isinstance(ListReader([{"key": "a"}]), Reader)
True
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from fpipe.errors import check_integer

__all__ = ["Reader"]


class Reader(abc.ABC):
    """The reader API; subclasses provide ``len``, ``in``, ``find_key``, ``find_index``, ``get``.

    Everything else is built on those (a subclass may override for speed). ``get_slice``
    returns a list, ``slice`` and ``iter`` return lazy iterators, and ``r[a:b:c]`` returns a
    list. ``seek``, ``next`` and ``rawnext`` keep datadings's cursor for old code: ``seek(k)``
    makes the next ``iter()`` without ``start`` begin at ``k`` (once; later passes start at 0).
    Iterators never move the cursor, so two iterators never interfere.

    ``blocks`` says how costly random access is: None (the default) when a sample costs about
    the same wherever it is read, or, for a reader that decodes its samples a block at a time
    (the row groups of a Parquet file, the record batches of an Arrow file), the bounds of
    those blocks: an int64 array of the first position of each block and the length at the
    end. The shuffles follow it: :class:`~fpipe.dataset.shuffling.BlockShuffler` reads each
    block once an epoch.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": "a"}, {"key": "b"}, {"key": "c"}])
    >>> reader.seek(1)
    >>> [s["key"] for s in reader], [s["key"] for s in reader]
    (['b', 'c'], ['a', 'b', 'c'])
    """

    _position = 0
    blocks: np.ndarray | None = None

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of samples."""

    @abc.abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether a sample has ``key``."""

    @abc.abstractmethod
    def find_key(self, index: int) -> Any:
        """The key of sample ``index``."""

    @abc.abstractmethod
    def find_index(self, key: Any) -> int:
        """The index of the sample with ``key``; :class:`KeyError` if there is none."""

    @abc.abstractmethod
    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        """Sample ``index`` (negative counts from the end); ``(key, sample)`` with ``yield_key``.

        ``raw=True`` gives the packed msgpack bytes; ``copy=False`` lets a reader return raw
        bytes as a ``memoryview`` into its buffers instead of a copy, and decoded arrays as
        read-only views (with ``copy=True`` they are writable copies).

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.get(0), reader.get(-1, yield_key=True)
        ({'key': 'a', 'n': 97}, ('c', {'key': 'c', 'n': 99}))
        >>> reader.get(1, raw=True)
        b'\\x82\\xa3key\\xa1b\\xa1nb'
        """

    def close(self) -> None:  # noqa: B027 (not abstract: a reader without files has none to release)
        """Release open files; the reader stays usable and reopens them when needed."""

    def prefetch(self, indices: Sequence[int]) -> None:  # noqa: B027 (a hint most readers ignore)
        """A hint: samples ``indices`` will be read next, in this order. Readers of datasets
        at URLs fetch their blocks in the background; the others have nothing to do.

        >>> from fpipe.dataset import ListReader
        >>> ListReader([{"key": "a"}]).prefetch([0])
        """

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _index(self, index: Any) -> int:
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(f"indices must be integers; got {type(index).__name__} {index!r:.40}") from None
        n = len(self)
        if position < 0:
            position += n
        if not 0 <= position < n:
            raise IndexError(f"index {index} out of range for {n} samples")
        return position

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        """Samples ``start`` to ``stop`` (clamped like a Python slice), read at once, as a list."""
        start, stop, _ = slice(start, stop).indices(len(self))
        return [self.get(i, yield_key, raw, copy) for i in range(start, stop)]

    def block_rows(self, start: int, stop: int) -> HeldRows:
        """Samples ``start`` to ``stop`` (within one of :attr:`blocks`) read at once and held,
        as an object whose ``take(rows)`` gives the samples at ``rows`` (an int array, relative
        to ``start``): how a shuffle of the blocks holds a few of them. Here a list of the
        decoded samples; a reader of Arrow keeps its columns and makes the samples asked for.

        >>> from fpipe.dataset import ListReader
        >>> import numpy as np
        >>> ListReader([{"key": k} for k in "abcd"]).block_rows(1, 4).take(np.array([2, 0]))
        [{'key': 'd'}, {'key': 'b'}]
        """
        return HeldRows(self.get_slice(start, stop))

    def get_many(self, indices: Iterable[int], yield_key: bool = False, raw: bool = False,
                 copy: bool = True) -> list:
        """Samples at ``indices`` (any order, repeats allowed), reading each run of
        consecutive indices with one :meth:`get_slice`.

        >>> from fpipe.dataset import ListReader
        >>> ListReader([{"key": k} for k in "abcd"]).get_many([3, 0, 1, 3])
        [{'key': 'd'}, {'key': 'a'}, {'key': 'b'}, {'key': 'd'}]
        """
        positions = np.array([self._index(i) for i in indices], dtype=np.int64)
        if not positions.size:
            return []
        order = np.argsort(positions, kind="stable")
        ranked = positions[order]
        # A run breaks wherever the next index is not the successor (repeats too: each
        # repeat is decoded again, so no two results are the same object).
        breaks = (np.flatnonzero(np.diff(ranked) != 1) + 1).tolist()
        result: list = [None] * len(positions)
        for begin, end in zip([0, *breaks], [*breaks, len(positions)]):
            first = int(ranked[begin])
            samples = (self.get_slice(first, first + end - begin, yield_key, raw, copy)
                       if end - begin > 1 else [self.get(first, yield_key, raw, copy)])
            for slot, sample in zip(order[begin:end].tolist(), samples):
                result[slot] = sample
        return result

    def slice(self, start: int | None, stop: int | None = None, yield_key: bool = False,
              raw: bool = False, copy: bool = True) -> Iterator:
        """An iterator over samples ``start`` to ``stop`` (datadings's ``slice``), read at once.

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> [sample["key"] for sample in reader.slice(1)], list(reader.slice(0, 2, yield_key=True))[1]
        (['b', 'c'], ('b', {'key': 'b', 'n': 98}))
        """
        start, stop, _ = slice(start, stop).indices(len(self))
        return self._chunks(start, stop, yield_key, raw, copy, max(1, stop - start))

    def iter(self, start: int | None = None, stop: int | None = None, yield_key: bool = False,
             raw: bool = False, copy: bool = True, chunk_size: int = 16) -> Iterator:
        """An independent iterator over samples ``start`` to ``stop`` (clamped like ``range``
        over a slice), reading ``chunk_size`` samples at a time.

        Without ``start`` it begins at the cursor set by :meth:`seek` (then resets the cursor).
        The output is the same for every ``chunk_size``.

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> [s["key"] for s in reader.iter(-2)], [s["key"] for s in reader.iter(0, 2, chunk_size=1)]
        (['b', 'c'], ['a', 'b'])
        >>> first, second = reader.iter(), reader.iter()
        >>> next(first)["key"], next(first)["key"], next(second)["key"]
        ('a', 'b', 'a')
        """
        chunk_size = check_integer("chunk_size", chunk_size, 1)
        if start is None:
            start = self._position if self._position < len(self) else 0
            self._position = 0
        start, stop, _ = slice(start, stop).indices(len(self))
        return self._chunks(start, stop, yield_key, raw, copy, chunk_size)

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for first in range(start, stop, chunk_size):
            yield from self.get_slice(first, min(stop, first + chunk_size), yield_key, raw, copy)

    def __iter__(self) -> Iterator:
        return self.iter()

    def rawiter(self, yield_key: bool = False) -> Iterator:
        """``iter(yield_key=yield_key, raw=True)``: the packed bytes of every sample."""
        return self.iter(yield_key=yield_key, raw=True)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self.get_slice(start, stop)
            return self.get_many(range(start, stop, step))
        return self.get(index)

    def seek_index(self, index: int) -> None:
        """Set the cursor used by :meth:`next` and by the next ``iter()`` without ``start``."""
        self._position = self._index(index)

    def seek(self, index: int) -> None:
        """Alias of :meth:`seek_index`: :meth:`next` and the next ``iter()`` without ``start``
        begin at ``index``.

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.seek(1)
        >>> [s["key"] for s in reader], [s["key"] for s in reader]
        (['b', 'c'], ['a', 'b', 'c'])
        """
        self.seek_index(index)

    def seek_key(self, key: Any) -> None:
        """Set the cursor to the sample with ``key``."""
        self.seek_index(self.find_index(key))

    def next(self) -> Any:
        """The sample at the cursor, advancing it (:class:`StopIteration` at the end).

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "abc.msgpack")
        >>> with FileWriter(path) as writer:
        ...     for key in "abc":
        ...         writer.write({"key": key, "n": ord(key)})
        >>> reader = MsgpackReader(path)
        >>> reader.seek_key("b")
        >>> reader.next()["key"], reader.next()["key"]
        ('b', 'c')
        >>> reader.next()
        Traceback (most recent call last):
        ...
        StopIteration
        """
        return self._advance(raw=False)

    def __next__(self) -> Any:
        return self._advance(raw=False)

    def rawnext(self) -> bytes:
        """Like :meth:`next`, as packed bytes."""
        return self._advance(raw=True)

    def _advance(self, raw: bool) -> Any:
        if self._position >= len(self):
            raise StopIteration
        sample = self.get(self._position, raw=raw)
        self._position += 1
        return sample


class HeldRows:
    """Samples held as a list (what :meth:`Reader.block_rows` gives by default): ``take(rows)``
    gives those at ``rows``. Not in ``__all__``: the orderings hold blocks with it."""

    __slots__ = ("samples",)

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def take(self, rows: np.ndarray) -> list:
        samples = self.samples
        return [samples[row] for row in rows.tolist()]
